package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// exitCodeOf maps a client error to the exit status of docs/cli.md.
func exitCodeOf(err error) int {
	var ue usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, ticketing.ErrInvalid):
		return ExitUsage
	case errors.Is(err, ticketing.ErrNotAcquired), errors.Is(err, ticketing.ErrNotHeld), errors.Is(err, ticketing.ErrLockLost):
		return ExitNo
	case errors.Is(err, ticketing.ErrAuthFailed):
		return ExitAuth
	case errors.Is(err, ticketing.ErrTLS):
		return ExitTLS
	}
	return ExitUnavailable
}

// message is err as one line, without the package prefix and without repeating the command
// name: `ticketing acquire: "k": not acquired within 1s (TIMED_OUT)`.
func message(name string, err error) string {
	s := strings.TrimPrefix(err.Error(), "ticketing: ")
	cmd := strings.TrimPrefix(name, "ticketing ")
	if rest, ok := strings.CutPrefix(s, cmd+" "); ok {
		s = rest
	} else if rest, ok := strings.CutPrefix(s, cmd+": "); ok {
		s = rest
	}
	for goName, cliName := range goOptionNames {
		s = strings.ReplaceAll(s, goName, cliName)
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// goOptionNames: the Go client names its options in its messages; the CLI names its own
// settings instead.
var goOptionNames = map[string]string{
	"(WithToken)":                         "(TICKETING_TOKEN or TICKETING_TOKEN_FILE)",
	"(configure the client with WithTLS)": "(use --tls or --tls-ca)",
	"WithEndpoints: ":                     "--addr: ",
}

// fail prints err for command name on one line and returns its exit status.
func fail(name string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, message(name, err))
	return exitCodeOf(err)
}

// failOrSignal is fail, unless a signal interrupted the command: then 128+N.
func failOrSignal(name string, err error, sig os.Signal) int {
	if sig != nil {
		fmt.Fprintf(stderr, "%s: interrupted (%s); nothing is held\n", name, signalName(sig))
		return signalExit(sig)
	}
	return fail(name, err)
}

// interruptible returns a context cancelled by SIGINT or SIGTERM, and the signal that did it.
func interruptible() (context.Context, func() os.Signal, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	got := make(chan os.Signal, 1)
	go func() {
		select {
		case s := <-ch:
			got <- s
			cancel()
		case <-ctx.Done():
		}
	}()
	which := func() os.Signal {
		select {
		case s := <-got:
			got <- s
			return s
		default:
			return nil
		}
	}
	// The returned stop ends the context but leaves the signals caught until the process exits:
	// restoring their default action would open a window, after a grant was printed and before
	// the exit, where SIGINT kills the process (status 130, "nothing is held") with the lock
	// held. A signal after the command's work is done is ignored: the work's outcome is the
	// answer. (Every caller is a command that exits right after; only the one process runs it.)
	return ctx, which, cancel
}

// signalName is the conventional name of a signal ("SIGTSTP"), where Go's is a description
// ("stopped").
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name, ok := signalNames[n]; ok {
			return name
		}
		return "signal " + strconv.Itoa(int(n))
	}
	return s.String()
}

func signalExit(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 130
}
