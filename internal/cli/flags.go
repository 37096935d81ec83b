package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// newFlagSet returns a flag set that reports its errors as one line (see parseCommand); --help
// prints the synopsis, what the command does and its flags on stdout.
func newFlagSet(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet("ticketing "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	helpText[fs] = fmt.Sprintf("usage: ticketing %s %s\n\n%s\n\nOptions (they may also come before the command name):\n", name, synopsis, about)
	return fs
}

var helpText = map[*flag.FlagSet]string{}

// printHelp prints the command's help: its synopsis and its flags, written as the docs write
// them (--name; the flag package would print -name).
func printHelp(fs *flag.FlagSet) {
	fmt.Fprint(stdout, helpText[fs])
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			line += fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintln(stdout, line)
	})
}

// usage prints one line `ticketing COMMAND: message` and returns exit status 2.
func usage(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(stderr, "%s: %s (see '%s --help')\n", fs.Name(), fmt.Sprintf(format, args...), fs.Name())
	return ExitUsage
}

// parseInterleaved parses flags anywhere among the arguments (`acquire KEY --lease 5s` and
// `acquire --lease 5s KEY` alike) and returns the positional arguments. After `--` everything is
// positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		consumed := len(args) - len(fs.Args())
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, fs.Args()...), nil
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseCommand parses flags and exactly len(names) positional arguments. On --help or an error
// it returns ok false and the exit status.
func parseCommand(fs *flag.FlagSet, args []string, names ...string) ([]string, int, bool) {
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printHelp(fs)
		return nil, ExitOK, false
	}
	if err != nil {
		return nil, usage(fs, "%v", err), false
	}
	if len(pos) != len(names) {
		if len(pos) < len(names) {
			return nil, usage(fs, "missing %s", strings.Join(names[len(pos):], " ")), false
		}
		return nil, usage(fs, "unexpected argument %q", pos[len(names)]), false
	}
	return pos, 0, true
}

// durationFlag is a duration flag whose errors say what was expected: `--lease 30` suggests 30s.
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string { return f.d.String() }

func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("%q has no unit (did you mean %ss or %sms?)", s, s, s)
		}
		return fmt.Errorf("%q is not a duration like 30s, 1m or 500ms", s)
	}
	f.d = d
	return nil
}

// checkLease validates a --lease before anything is sent.
func checkLease(d time.Duration) error {
	switch {
	case d < ticketing.MinLease:
		return fmt.Errorf("--lease %v must be at least 1ms", d)
	case d > ticketing.MaxLease:
		return fmt.Errorf("--lease %v is above the protocol's maximum of %v", d, ticketing.MaxLease)
	}
	return nil
}

func checkKey(key string) error {
	switch {
	case key == "":
		return errors.New("KEY is empty")
	case len(key) > ticketing.MaxKeyLen:
		return fmt.Errorf("KEY is %d bytes, above the protocol's %d", len(key), ticketing.MaxKeyLen)
	}
	return nil
}

// waitFlag is --wait: a duration, or "forever" (the default: wait until granted or interrupted).
type waitFlag struct {
	d       time.Duration
	forever bool
}

func (w *waitFlag) String() string {
	if w == nil || w.forever {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" || s == "inf" || s == "-1" {
		w.forever = true
		return nil
	}
	var d durationFlag
	if err := d.Set(s); err != nil {
		return err
	}
	if d.d < 0 {
		return fmt.Errorf("%v is negative (0 tries once; \"forever\" waits without limit)", d.d)
	}
	w.d, w.forever = d.d, false
	return nil
}

func (w *waitFlag) options() []ticketing.AcquireOption {
	if w.forever {
		return nil
	}
	return []ticketing.AcquireOption{ticketing.WithWaitTimeout(w.d)}
}

func parseToken(s string) (uint64, error) {
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, fmt.Errorf("TOKEN %q is not a positive integer", s)
	}
	return t, nil
}
