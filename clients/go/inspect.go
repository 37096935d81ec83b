package ticketing

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// KeyInfo is the state of one key, as INSPECT reports it.
type KeyInfo struct {
	Key           string
	Held          bool          // somebody holds the key
	Token         uint64        // the holder's fencing token, only when Mine or TokenMatch; else 0
	Mine          bool          // this client's session holds the key
	TokenMatch    bool          // the token asked about (Client.Verify) is the holder's
	LeaseLeft     time.Duration // time left on the holder's lease
	HeldFor       time.Duration // time since the lock was granted
	Waiters       int           // acquires queued on the key
	LockDelayLeft time.Duration // time the key stays unavailable after a lease expiry, or the start-up wait left
	Stalled       bool          // the key waits for the server's storage before its next grant
	Startup       bool          // the server is in its start-up wait (LockDelayLeft says until when): no grant before it ends
}

// Inspect reports whether key is held, how long its lease has left, since when it is held, how
// many wait, and the lock-delay left. It changes nothing. The holder's token is shown only to the
// session that holds it (KeyInfo.Mine): looking at a key does not hand out the means to release
// it. A key nobody holds or waits for reports all zeros.
func (c *Client) Inspect(ctx context.Context, key string) (KeyInfo, error) {
	return c.inspect(ctx, "inspect", key, 0)
}

// Verify asks the server whether token holds key (INSPECT with the token). It changes nothing.
// The token must be positive.
func (c *Client) Verify(ctx context.Context, key string, token uint64) (bool, error) {
	if token == 0 {
		return false, &opError{kind: ErrInvalid, op: "verify", key: key, hasK: true, msg: "the token must be positive"}
	}
	info, err := c.inspect(ctx, "verify", key, token)
	return info.TokenMatch, err
}

func (c *Client) inspect(ctx context.Context, op, key string, token uint64) (KeyInfo, error) {
	if err := checkKey(op, key); err != nil {
		return KeyInfo{}, err
	}
	cl := getCall()
	cl.req = wire.Request{Op: wire.OpInspect, Token: token}
	cl.key = key
	res, err := c.do(ctx, cl, c.opts.requestTimeout)
	if err != nil {
		return KeyInfo{}, err
	}
	putCall(cl)
	if err := res.statusError(wire.OpInspect, key, token); err != nil {
		return KeyInfo{}, err
	}
	return decodeInspect(key, &res)
}

// decodeInspect reads an INSPECT answer (PROTOCOL.md, "Operations"). Unknown flag bits are
// ignored.
func decodeInspect(key string, res *result) (KeyInfo, error) {
	if len(res.data) != wire.InspectDataSize {
		return KeyInfo{}, &opError{kind: ErrProtocol, op: "inspect", key: key, hasK: true,
			msg: fmt.Sprintf("the answer carries %d bytes of data, want %d", len(res.data), wire.InspectDataSize)}
	}
	ms := func(v uint32) time.Duration { return durationMs(int64(v)) }
	flags := binary.BigEndian.Uint32(res.data[8:12])
	info := KeyInfo{
		Key:           key,
		Held:          flags&wire.InspectHeld != 0,
		Mine:          flags&wire.InspectSession != 0,
		TokenMatch:    flags&wire.InspectTokenMatch != 0,
		Stalled:       flags&wire.InspectStalled != 0,
		Startup:       flags&wire.InspectStartup != 0,
		LeaseLeft:     ms(res.lease),
		HeldFor:       ms(binary.BigEndian.Uint32(res.data[0:4])),
		Waiters:       int(res.detail),
		LockDelayLeft: ms(binary.BigEndian.Uint32(res.data[4:8])),
	}
	if info.Mine || info.TokenMatch {
		info.Token = res.token
	}
	return info, nil
}
