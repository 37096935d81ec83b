package ticketing

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// KeyInfo is the state of one key, as INSPECT reports it.
type KeyInfo struct {
	Key           string
	Held          bool
	Token         uint64        // the holder's fencing token; 0 when not held
	LeaseLeft     time.Duration // time left on the holder's lease
	HeldFor       time.Duration // time since the lock was granted
	Waiters       int           // acquires queued on the key
	LockDelayLeft time.Duration // time the key stays unavailable after a lease expiry
}

// Inspect reports who holds key (its token), how long its lease has left, since when it is held
// and how many wait. It changes nothing. A key nobody holds or waits for reports all zeros.
func (c *Client) Inspect(ctx context.Context, key string) (KeyInfo, error) {
	if err := checkKey(key); err != nil {
		return KeyInfo{}, err
	}
	res, _, err := c.roundTrip(ctx, &wire.Request{Op: wire.OpInspect, Key: []byte(key)}, true)
	if err != nil {
		return KeyInfo{}, err
	}
	return decodeInspect(key, &res)
}

func decodeInspect(key string, res *result) (KeyInfo, error) {
	if len(res.data) != wire.InspectDataSize {
		return KeyInfo{}, fmt.Errorf("%w: INSPECT answer carries %d bytes of data, want %d", ErrProtocol, len(res.data), wire.InspectDataSize)
	}
	ms := func(v uint32) time.Duration { return time.Duration(v) * time.Millisecond }
	return KeyInfo{
		Key:           key,
		Held:          res.token != 0,
		Token:         res.token,
		LeaseLeft:     ms(res.lease),
		HeldFor:       ms(binary.BigEndian.Uint32(res.data[0:4])),
		Waiters:       int(res.detail),
		LockDelayLeft: ms(binary.BigEndian.Uint32(res.data[4:8])),
	}, nil
}
