package main

import (
	"bufio"
	"fmt"
	"net"
	"slices"
	"time"
)

// The round-trip bound of (a) at one connection (issue 28). One connection with depth requests
// in flight can do at most depth operations per round trip, so no server beats depth divided by
// the time the machine takes to carry one small frame there and back: a PING answered without
// touching any state (Ticketing, the server before sessions and the null server answer it in
// their reader; Redis's PING likewise). pingRTT measures that round trip right after the point,
// on the same server process, one frame at a time.

const (
	pingCount   = 2000                   // round trips per measurement
	pingMaxTime = 500 * time.Millisecond // bound on one measurement
)

// pingRTT returns the median of up to pingCount PING round trips on a new connection to
// system at addr; ok is false for a system without a PING of this kind (etcd).
func pingRTT(system, addr string) (p50 time.Duration, ok bool, err error) {
	var nc net.Conn
	var sess *session
	switch system {
	case "ticketing", "null":
		nc, sess, err = dialTicketing(addr)
	case "prev":
		nc, err = dialPrev(addr, 5*time.Second)
		sess = newSession()
	case "redis":
		nc, err = net.DialTimeout("tcp", addr, 5*time.Second)
	default:
		return 0, false, nil
	}
	if err != nil {
		return 0, true, fmt.Errorf("%s: ping: %w", system, err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(pingMaxTime + 5*time.Second))
	r := bufio.NewReaderSize(nc, 4096)
	var frame []byte
	if system == "redis" {
		frame = []byte("PING\r\n")
	}
	rtts := make([]time.Duration, 0, pingCount)
	end := time.Now().Add(pingMaxTime)
	var resp response
	for len(rtts) < pingCount && time.Now().Before(end) {
		if sess != nil {
			frame = appendRequest(frame[:0], opPing, sess.take(), 0, 0, 0, nil)
		}
		t0 := time.Now()
		if _, err := nc.Write(frame); err != nil {
			return 0, true, fmt.Errorf("%s: ping: %w", system, err)
		}
		if sess != nil {
			err = readResponse(r, &resp)
			if err == nil && (resp.op != opPing || resp.status != stOK) {
				err = fmt.Errorf("answer op %#x status %d", resp.op, resp.status)
			}
		} else {
			err = readPong(r)
		}
		if err != nil {
			return 0, true, fmt.Errorf("%s: ping: %w", system, err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2], true, nil
}

// readPong reads Redis's answer to PING.
func readPong(r *bufio.Reader) error {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if string(line) != "+PONG\r\n" {
		return fmt.Errorf("answer %q", line)
	}
	return nil
}
