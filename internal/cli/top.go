package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/server"
)

// Commands that talk to a server's admin listener (HTTP), not to its client port:
//
//	ticketing top           the most contended keys, live
//	ticketing healthcheck   exit 0 when /healthz (or /readyz) answers 200 (the container's health check)
//
// and RunOps, which dispatches them and `ticketing deploy` (deploy.go).

// RunOps runs `ticketing deploy`, `ticketing top` or `ticketing healthcheck` (cmd) with args
// and returns the exit code.
func RunOps(cmd string, args []string) int {
	switch cmd {
	case "deploy":
		return runDeploy(args)
	case "top":
		return runTop(args)
	case "healthcheck":
		return runHealthcheck(args)
	}
	fmt.Fprintf(stderr, "ticketing: unknown command %q\n", cmd)
	return ExitUsage
}

// adminTarget is how to reach an admin listener.
type adminTarget struct {
	base   string // http://host:port or https://host:port
	token  string // bearer credential ("" on loopback)
	client *adminhttp.Client
}

// adminFlags adds the flags that locate the admin listener and returns a function that builds
// the target after parsing.
func adminFlags(fs *flag.FlagSet) func() (*adminTarget, error) {
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each request")
	return adminFlagsTimeout(fs, timeout)
}

// adminFlagsTimeout is adminFlags for a command that has its own --timeout.
func adminFlagsTimeout(fs *flag.FlagSet, timeout *time.Duration) func() (*adminTarget, error) {
	addr := fs.String("admin-addr", defaultAdminAddr(), "the server's admin listener host:port (env TICKETING_ADMIN_ADDR; default: TICKETING_ADDR's port + 1)")
	ca := fs.String("admin-ca", os.Getenv("TICKETING_ADMIN_CA"), "PEM CA bundle to verify the admin listener's certificate: use HTTPS (env TICKETING_ADMIN_CA)")
	tokenFile := fs.String("admin-token-file", os.Getenv("TICKETING_ADMIN_TOKEN_FILE"), "file with the admin bearer credential (or env TICKETING_ADMIN_TOKEN); needed off loopback")
	return func() (*adminTarget, error) {
		t := &adminTarget{base: "http://" + *addr, token: os.Getenv("TICKETING_ADMIN_TOKEN"), client: &adminhttp.Client{Timeout: *timeout}}
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return nil, err
			}
			t.token = strings.TrimRight(string(b), "\r\n")
		}
		if *ca != "" {
			pem, err := os.ReadFile(*ca)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s: no certificate found", *ca)
			}
			t.base = "https://" + *addr
			t.client.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		return t, nil
	}
}

// defaultAdminAddr is TICKETING_ADMIN_ADDR, else the client address (TICKETING_ADDR, default
// 127.0.0.1:7070) with the next port, as the server derives it; a wildcard host becomes
// loopback.
func defaultAdminAddr() string {
	if a := os.Getenv("TICKETING_ADMIN_ADDR"); a != "" && a != "off" {
		return a
	}
	addr := os.Getenv("TICKETING_ADDR")
	if addr == "" || strings.Contains(addr, ",") {
		addr = "127.0.0.1:7070"
	}
	host, port, err := net.SplitHostPort(addr)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		return "127.0.0.1:7071"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1))
}

// get fetches path and decodes its JSON into v (v nil: only the status matters).
func (t *adminTarget) get(ctx context.Context, path string, v any) error {
	var header map[string]string
	if t.token != "" {
		header = map[string]string{"Authorization": "Bearer " + t.token}
	}
	resp, err := t.client.Do(ctx, "GET", t.base+path, header, nil)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(resp.Body)))
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(resp.Body, v)
}

// fetchKeyInfo asks the admin listener about key: holder (with token) and waiters. For
// `ticketing inspect`, which shows the waiters when the admin listener is reachable.
func fetchKeyInfo(ctx context.Context, t *adminTarget, key string, waiters int) (*server.KeyInfo, error) {
	var k server.KeyInfo
	err := t.get(ctx, "/api/key?key="+url.QueryEscape(key)+"&waiters="+strconv.Itoa(waiters), &k)
	return &k, err
}

// addWaitersFlags gives `ticketing inspect` its --waiters flag (and where the admin listener
// is): the returned function prints KEY's waiters in queue order, from the admin listener, as a
// table, or with asJSON as one more JSON line ({"key", "waiter_count", "waiters"}). It does
// nothing without --waiters.
func addWaitersFlags(fs *flag.FlagSet) func(ctx context.Context, key string, asJSON bool) error {
	on := fs.Bool("waiters", false, "also list who waits, in queue order (session, remote address, waited, wait left), from the server's admin listener")
	timeout := 5 * time.Second
	target := adminFlagsTimeout(fs, &timeout)
	return func(ctx context.Context, key string, asJSON bool) error {
		if !*on {
			return nil
		}
		t, err := target()
		if err != nil {
			return err
		}
		k, err := fetchKeyInfo(ctx, t, key, 1000)
		if err != nil {
			return fmt.Errorf("waiters from the admin listener %s: %w", t.base, err)
		}
		if asJSON {
			b, _ := json.Marshal(map[string]any{"key": k.Key, "waiter_count": k.WaiterCount, "waiters": k.Waiters})
			fmt.Fprintln(stdout, string(b))
			return nil
		}
		printWaiters(stdout, k)
		return nil
	}
}

// printWaiters writes k's waiters as a table (nothing when none wait).
func printWaiters(w io.Writer, k *server.KeyInfo) {
	if len(k.Waiters) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tSESSION\tREMOTE\tWAITED\tWAIT LEFT\tLEASE")
	for _, x := range k.Waiters {
		left := "no limit"
		if x.WaitLeftMs != nil {
			left = fmtMs(*x.WaitLeftMs)
		}
		remote := x.Remote
		if remote == "" {
			remote = "detached"
		}
		fmt.Fprintf(tw, "%d\t%s#%d\t%s\t%s\t%s\t%s\n", x.Position, x.Session, x.SessionNo, remote, fmtMs(x.WaitedMs), left, fmtMs(x.LeaseMs))
	}
	tw.Flush()
	if k.WaiterCount > len(k.Waiters) {
		fmt.Fprintf(w, "... and %d more\n", k.WaiterCount-len(k.Waiters))
	}
}

func fmtMs(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).String()
}

type topSnapshot struct {
	at    time.Time
	stats server.Stats
	keys  map[string]server.TopKey
	order []server.TopKey
}

func fetchTop(ctx context.Context, t *adminTarget, n int) (*topSnapshot, error) {
	var top struct {
		Metrics bool            `json:"metrics"`
		Keys    []server.TopKey `json:"keys"`
	}
	s := &topSnapshot{at: time.Now(), keys: map[string]server.TopKey{}}
	if err := t.get(ctx, "/api/stats", &s.stats); err != nil {
		return nil, err
	}
	if err := t.get(ctx, "/api/top?n="+strconv.Itoa(n), &top); err != nil {
		return nil, err
	}
	if !top.Metrics {
		return nil, errors.New("the server runs with TICKETING_METRICS=off: no contention is counted")
	}
	for _, k := range top.Keys {
		s.keys[k.Key] = k
	}
	s.order = top.Keys
	return s, nil
}

// runTop is `ticketing top`: the most contended keys, refreshed every interval, sorted by the
// acquires that queued on them during the last interval, then by how many wait now.
func runTop(args []string) int {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := adminFlags(fs)
	interval := fs.Duration("interval", 2*time.Second, "refresh interval")
	n := fs.Int("n", 20, "keys to show (at most 64)")
	count := fs.Int("count", 0, "stop after this many screens (0: until interrupted)")
	once := fs.Bool("once", false, "print one screen (totals since the server started) and exit: --count 1")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ticketing top [--admin-addr HOST:PORT] [--interval D] [--n N] [--once]\n\nThe most contended keys of a server, live, from its admin listener.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if *once {
		*count = 1
	}
	t, err := target()
	if err != nil {
		fmt.Fprintln(stderr, "ticketing top:", err)
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var prev *topSnapshot
	for screen := 1; ; screen++ {
		cur, err := fetchTop(ctx, t, *n)
		if err != nil {
			if ctx.Err() != nil {
				return ExitOK
			}
			fmt.Fprintln(stderr, "ticketing top:", err)
			return ExitUnavailable
		}
		if *count != 1 {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home, clear
		}
		printTop(stdout, t.base, prev, cur)
		if *count > 0 && screen >= *count {
			return ExitOK
		}
		prev = cur
		select {
		case <-ctx.Done():
			return ExitOK
		case <-time.After(*interval):
		}
	}
}

func printTop(w io.Writer, base string, prev, cur *topSnapshot) {
	st := cur.stats
	fmt.Fprintf(w, "ticketing top — %s (%s) — %s\n", strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://"), st.Role, cur.at.Format("15:04:05"))
	if prev != nil {
		dt := cur.at.Sub(prev.at).Seconds()
		ps := prev.stats
		fmt.Fprintf(w, "ops/s %.0f  grants/s %.0f  hand-offs/s %.0f  timeouts/s %.1f  ", (st.Operations-ps.Operations)/dt,
			(st.Grants-ps.Grants)/dt, (st.Handoffs-ps.Handoffs)/dt, (st.Timeouts-ps.Timeouts)/dt)
	}
	fmt.Fprintf(w, "held %d  waiting %d  connections %d  sessions %d\n\n", st.HeldNow, st.WaitersNow, st.Connections, st.Sessions)
	type row struct {
		server.TopKey
		delta uint64
	}
	var rows []row
	for _, k := range cur.order {
		r := row{TopKey: k}
		if prev != nil {
			if p, ok := prev.keys[k.Key]; ok && k.Queued >= p.Queued {
				r.delta = k.Queued - p.Queued
			} else {
				r.delta = k.Queued
			}
		}
		rows = append(rows, r)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].delta != rows[j].delta {
			return rows[i].delta > rows[j].delta
		}
		if rows[i].Waiters != rows[j].Waiters {
			return rows[i].Waiters > rows[j].Waiters
		}
		return rows[i].Queued > rows[j].Queued
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "KEY\tQUEUED\tWAITING\tHELD\tHAND-OFFS\tMEAN WAIT\tTIMEOUTS"
	if prev != nil {
		head = "KEY\tQUEUED/INTERVAL\tQUEUED\tWAITING\tHELD\tHAND-OFFS\tMEAN WAIT\tTIMEOUTS"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		held := "no"
		if r.Held {
			held = "yes"
		}
		wait := "-"
		if r.Handoffs > 0 {
			wait = time.Duration(r.MeanWaitS * float64(time.Second)).Round(time.Microsecond).String()
		}
		queued := strconv.FormatUint(r.Queued, 10)
		if r.Error > 0 {
			queued += "±" + strconv.FormatUint(r.Error, 10)
		}
		if prev != nil {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%d\t%s\t%d\n", r.Key, r.delta, queued, r.Waiters, held, r.Handoffs, wait, r.Timeouts)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%d\n", r.Key, queued, r.Waiters, held, r.Handoffs, wait, r.Timeouts)
		}
	}
	tw.Flush()
	if len(rows) == 0 {
		fmt.Fprintln(w, "(no contention yet: no acquire has queued)")
	}
}

// runHealthcheck is `ticketing healthcheck`: exit 0 when the admin listener's /healthz (or,
// with --ready, /readyz) answers 200, else 1. The container image's HEALTHCHECK runs it.
func runHealthcheck(args []string) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := adminFlags(fs)
	ready := fs.Bool("ready", false, "check /readyz (serving clients now) instead of /healthz (alive)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: ticketing healthcheck [--ready] [--admin-addr HOST:PORT]\n\n"+
			"Exits 0 when the admin listener's /healthz (with --ready: /readyz) answers 200, else 1.\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	t, err := target()
	if err != nil {
		fmt.Fprintln(stderr, "ticketing healthcheck:", err)
		return ExitUsage
	}
	path := "/healthz"
	if *ready {
		path = "/readyz"
	}
	if err := t.get(context.Background(), path, nil); err != nil {
		fmt.Fprintln(stderr, "ticketing healthcheck:", err)
		return ExitNo
	}
	fmt.Fprintln(stdout, "ok")
	return ExitOK
}
