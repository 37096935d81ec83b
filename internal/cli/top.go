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

// adminTarget is how to reach an admin listener: one node, or several (a cluster's, in the order
// given) of which the first that answers is asked; asked is the one that answered last.
type adminTarget struct {
	bases   []string // http://host:port or https://host:port
	token   string   // bearer credential ("" on loopback)
	client  *adminhttp.Client
	asked   string
	derived bool   // the addresses were derived from client addresses (port + 1), not given
	scheme  string // "http://" or "https://"
}

// adminFlags adds the flags that locate the admin listener and returns a function that builds
// the target after parsing. clientAddr, if not nil, is the command's own client address flag
// (--addr), which the admin address is derived from when none is given.
func adminFlags(fs *flag.FlagSet, clientAddr func() string) func() (*adminTarget, error) {
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each request")
	return adminFlagsTimeout(fs, timeout, clientAddr)
}

// adminFlagsTimeout is adminFlags for a command that has its own --timeout.
func adminFlagsTimeout(fs *flag.FlagSet, timeout *time.Duration, clientAddr func() string) func() (*adminTarget, error) {
	addr := fs.String("admin-addr", os.Getenv("TICKETING_ADMIN_ADDR"), "admin listener(s) host:port, comma-separated (env TICKETING_ADMIN_ADDR; default: each client address's port + 1, from --addr or TICKETING_ADDR)")
	ca := fs.String("admin-ca", os.Getenv("TICKETING_ADMIN_CA"), "PEM CA bundle to verify the admin listener's certificate: use HTTPS (env TICKETING_ADMIN_CA)")
	tokenFile := fs.String("admin-token-file", os.Getenv("TICKETING_ADMIN_TOKEN_FILE"), "file with the admin bearer credential (or env TICKETING_ADMIN_TOKEN); needed off loopback")
	return func() (*adminTarget, error) {
		client := os.Getenv("TICKETING_ADDR")
		if clientAddr != nil {
			client = clientAddr()
		}
		addrs, err := adminAddrs(*addr, client)
		if err != nil {
			return nil, err
		}
		t := &adminTarget{token: os.Getenv("TICKETING_ADMIN_TOKEN"), client: &adminhttp.Client{Timeout: *timeout}}
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return nil, err
			}
			t.token = strings.TrimRight(string(b), "\r\n")
		}
		scheme := "http://"
		if *ca != "" {
			pem, err := os.ReadFile(*ca)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s: no certificate found", *ca)
			}
			scheme = "https://"
			t.client.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		for _, a := range addrs {
			t.bases = append(t.bases, scheme+a)
		}
		t.scheme, t.derived = scheme, strings.TrimSpace(*addr) == ""
		return t, nil
	}
}

// adminAddrs is where the admin listeners are: the addresses given (--admin-addr or
// TICKETING_ADMIN_ADDR), else one per client address (--addr or TICKETING_ADDR, a cluster's list
// included) with the next port, as a server derives its own, a wildcard host becoming loopback;
// else 127.0.0.1:7071. A client address it cannot derive from is an error naming the setting to
// give instead: a guess could be another server.
func adminAddrs(admin, client string) ([]string, error) {
	if admin == "off" {
		return nil, errors.New("TICKETING_ADMIN_ADDR=off: the admin listener is off; give --admin-addr")
	}
	if admin != "" {
		var out []string
		for _, a := range strings.Split(admin, ",") {
			a = strings.TrimSpace(a)
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("admin address %q: want host:port", a)
			}
			out = append(out, a)
		}
		return out, nil
	}
	if strings.TrimSpace(client) == "" {
		client = "127.0.0.1:7070"
	}
	var out []string
	for _, c := range strings.Split(client, ",") {
		c = strings.TrimSpace(c)
		host, port, err := net.SplitHostPort(c)
		p, perr := strconv.Atoi(port)
		if err != nil || perr != nil || p <= 0 || p >= 65535 {
			return nil, fmt.Errorf("cannot derive the admin listener's address from the client address %q: give --admin-addr (or TICKETING_ADMIN_ADDR)", c)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = "127.0.0.1"
		}
		out = append(out, net.JoinHostPort(host, strconv.Itoa(p+1)))
	}
	return out, nil
}

// one is the target's one node, for commands about a single node (healthcheck): a list is
// refused rather than one of its nodes picked.
func (t *adminTarget) one() (string, error) {
	if len(t.bases) != 1 {
		return "", fmt.Errorf("this checks one node, and %d admin addresses were given (%s): give one --admin-addr", len(t.bases), strings.Join(t.hosts(), ","))
	}
	return t.bases[0], nil
}

func (t *adminTarget) hosts() []string {
	var h []string
	for _, b := range t.bases {
		h = append(h, strings.TrimPrefix(strings.TrimPrefix(b, "https://"), "http://"))
	}
	return h
}

// get fetches path from the first node that answers and decodes its JSON into v (v nil: only
// the status matters); t.asked is then that node's address.
func (t *adminTarget) get(ctx context.Context, path string, v any) error {
	var header map[string]string
	if t.token != "" {
		header = map[string]string{"Authorization": "Bearer " + t.token}
	}
	var errs []error
	order := t.bases
	if t.asked != "" && len(t.bases) > 1 { // the node that answered before, first
		order = nil
		for _, b := range t.bases {
			if strings.HasSuffix(b, "://"+t.asked) {
				order = append([]string{b}, order...)
			} else {
				order = append(order, b)
			}
		}
	}
	for _, base := range order {
		resp, err := t.client.Do(ctx, "GET", base+path, header, nil)
		if err != nil {
			errs = append(errs, err)
			continue // another node may answer
		}
		t.asked = strings.TrimPrefix(strings.TrimPrefix(base, "https://"), "http://")
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s%s: %s: %s", t.asked, path, resp.Status, strings.TrimSpace(string(resp.Body)))
		}
		if v == nil {
			return nil
		}
		return json.Unmarshal(resp.Body, v)
	}
	return errors.Join(errs...)
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
func addWaitersFlags(fs *flag.FlagSet, clientAddr func() string) func(ctx context.Context, key string, asJSON bool) error {
	on := fs.Bool("waiters", false, "also list who waits, in queue order (session, remote address, waited, wait left), from the server's admin listener")
	timeout := 5 * time.Second
	target := adminFlagsTimeout(fs, &timeout, clientAddr)
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
			return fmt.Errorf("waiters from the admin listener (%s): %w", strings.Join(t.hosts(), ","), err)
		}
		if asJSON {
			b, _ := json.Marshal(map[string]any{"key": k.Key, "waiter_count": k.WaiterCount, "waiters": k.Waiters, "admin": t.asked})
			fmt.Fprintln(stdout, string(b))
			return nil
		}
		fmt.Fprintf(stdout, "waiters: %d (from the admin listener %s)\n", k.WaiterCount, t.asked)
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
	at        time.Time
	stats     server.Stats
	keys      map[string]server.TopKey
	order     []server.TopKey
	uncertain int // keys left out: their counts are mostly the sketch's error
}

func fetchTop(ctx context.Context, t *adminTarget, n int) (*topSnapshot, error) {
	var top server.TopList
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
	s.order, s.uncertain = top.Keys, top.Uncertain
	return s, nil
}

// runTop is `ticketing top`: the most contended keys, refreshed every interval, sorted by the
// acquires that queued on them during the last interval, then by how many wait now.
func runTop(args []string) int {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := adminFlags(fs, nil)
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
		printTop(stdout, t.asked, prev, cur)
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
	if st.Role != "single" && !st.Serving {
		leader := "none known"
		if st.Leader != "" {
			leader = st.Leader + " (client address " + st.LeaderAddr + ")"
		}
		fmt.Fprintf(w, "a %s: clients are served by the leader, %s; grants, waits and keys below are the cluster's (applied from its log), ops/s and connections this node's own\n", st.Role, leader)
	}
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
	estimates := false
	for _, r := range rows {
		estimates = estimates || r.Error > 0
		held := "no"
		if r.Held {
			held = "yes"
		}
		wait := "-"
		if r.Handoffs > 0 {
			wait = time.Duration(r.MeanWaitS * float64(time.Second)).Round(time.Microsecond).String()
		}
		queued := fmtQueued(r.TopKey)
		if prev != nil {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%d\t%s\t%d\n", r.Key, r.delta, queued, r.Waiters, held, r.Handoffs, wait, r.Timeouts)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%d\n", r.Key, queued, r.Waiters, held, r.Handoffs, wait, r.Timeouts)
		}
	}
	tw.Flush()
	if len(rows) == 0 && cur.uncertain == 0 {
		fmt.Fprintln(w, "(no contention yet: no acquire has queued)")
	}
	if cur.uncertain > 0 {
		fmt.Fprintf(w, "(%d more keys queued too few times to count: their counts would be mostly estimate)\n", cur.uncertain)
	}
	if estimates {
		fmt.Fprintln(w, "~N: an estimate (at least N minus the error bound; --json or /api/top have both)")
	}
}

// fmtQueued shows a key's queued count: exact, or "~N" when the sketch's count is an estimate
// (a key that replaced another inherits its count as an error bound): never "N ±E" as if N were
// a count.
func fmtQueued(k server.TopKey) string {
	if k.Error == 0 {
		return strconv.FormatUint(k.Queued, 10)
	}
	return "~" + strconv.FormatUint(k.Queued, 10)
}

// runHealthcheck is `ticketing healthcheck`: exit 0 when the admin listener's /healthz (or,
// with --ready, /readyz) answers 200, else 1. The container image's HEALTHCHECK runs it.
func runHealthcheck(args []string) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := adminFlags(fs, nil)
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
	if _, err := t.one(); err != nil {
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
	fmt.Fprintln(stdout, "ok", t.asked)
	return ExitOK
}
