package server

import (
	"bytes"
	"hash/maphash"
	"sort"
)

// topKeysSize is how many keys the contention sketch tracks.
const topKeysSize = 64

// topKeys finds the most contended keys with bounded memory: the Space-Saving algorithm
// (Metwally et al., 2005) over the stream of queued acquires. It tracks at most size keys;
// a key not tracked replaces the one with the smallest count and inherits that count as its
// error bound, so a tracked key's true count lies in [count-err, count], and every key whose
// true count exceeds (total queued)/size is tracked.
//
// Alongside the count, it sums what happened to a tracked key's waiters while it was tracked:
// the time hand-offs had waited, and wait timeouts.
//
// All of it lives in fixed arrays: once the slots' key buffers have grown to the longest key
// seen, nothing allocates. Not safe for concurrent use: the server calls it under Server.mu.
type topKeys struct {
	seed    maphash.Seed
	slots   []topSlot
	used    int
	buckets []int32 // chained hash index over slots; -1 = empty
}

type topSlot struct {
	key      []byte
	hash     uint64
	next     int32 // next slot in the same bucket
	count    uint64
	err      uint64
	waitNs   int64  // summed wait of the hand-offs of this key while tracked
	handoffs uint64 // hand-offs while tracked
	timeouts uint64 // wait timeouts while tracked
}

// TopKey is one entry of the sketch, with what the table reports about the key now.
//
// Queued is exact when Error is 0. Otherwise it is an estimate: the true count lies between
// QueuedMin (Queued - Error) and Queued, and displays show it as "~Queued", never as a count.
// A key is Uncertain when its error bound is at least half its count (more of the count may be
// other keys' than its own): /api/top leaves such keys out unless asked for all.
type TopKey struct {
	Key       string  `json:"key"`
	Queued    uint64  `json:"queued"`      // acquires that queued on the key (an upper bound; exact when error is 0)
	Error     uint64  `json:"error"`       // Queued overcounts by at most this
	QueuedMin uint64  `json:"queued_min"`  // at least this many queued: Queued - Error
	Uncertain bool    `json:"uncertain"`   // Error >= Queued/2
	Handoffs  uint64  `json:"handoffs"`    // hand-offs while tracked
	MeanWaitS float64 `json:"mean_wait_s"` // mean wait of those hand-offs, seconds
	Timeouts  uint64  `json:"timeouts"`    // wait timeouts while tracked
	Held      bool    `json:"held"`
	Waiters   int     `json:"waiters"`
}

func (t *topKeys) init(size int) {
	t.seed = maphash.MakeSeed()
	t.slots = make([]topSlot, size)
	for i := range t.slots {
		t.slots[i].key = make([]byte, 0, 256) // the default key length limit: no growth in practice
	}
	t.buckets = make([]int32, 2*size)
	for i := range t.buckets {
		t.buckets[i] = -1
	}
}

func (t *topKeys) find(key []byte, h uint64) int32 {
	for i := t.buckets[h%uint64(len(t.buckets))]; i >= 0; i = t.slots[i].next {
		if t.slots[i].hash == h && bytes.Equal(t.slots[i].key, key) {
			return i
		}
	}
	return -1
}

func (t *topKeys) unlink(i int32) {
	b := &t.buckets[t.slots[i].hash%uint64(len(t.buckets))]
	for *b != i {
		b = &t.slots[*b].next
	}
	*b = t.slots[i].next
}

// queued counts one queued acquire on key.
func (t *topKeys) queued(key []byte) {
	if len(t.slots) == 0 {
		return
	}
	h := maphash.Bytes(t.seed, key)
	if i := t.find(key, h); i >= 0 {
		t.slots[i].count++
		return
	}
	var i int32
	var floor uint64
	if t.used < len(t.slots) {
		i = int32(t.used)
		t.used++
	} else {
		i = 0
		for j := range t.slots {
			if t.slots[j].count < t.slots[i].count {
				i = int32(j)
			}
		}
		floor = t.slots[i].count
		t.unlink(i)
	}
	s := &t.slots[i]
	s.key = append(s.key[:0], key...)
	s.hash, s.count, s.err = h, floor+1, floor
	s.waitNs, s.handoffs, s.timeouts = 0, 0, 0
	b := &t.buckets[h%uint64(len(t.buckets))]
	s.next, *b = *b, i
}

// waited records a hand-off of key after waited ns, if key is tracked.
func (t *topKeys) waited(key []byte, waited int64) {
	if len(t.slots) == 0 {
		return
	}
	if i := t.find(key, maphash.Bytes(t.seed, key)); i >= 0 {
		t.slots[i].waitNs += waited
		t.slots[i].handoffs++
	}
}

// timedOut records a wait timeout on key, if key is tracked.
func (t *topKeys) timedOut(key []byte, waited int64) {
	if len(t.slots) == 0 {
		return
	}
	if i := t.find(key, maphash.Bytes(t.seed, key)); i >= 0 {
		t.slots[i].timeouts++
	}
}

// list returns the n most contended keys, most contended first (allocates; not for the
// request path), and how many uncertain keys it left out (all: none left out).
func (t *topKeys) list(n int, all bool) ([]TopKey, int) {
	out := make([]TopKey, 0, t.used)
	uncertain := 0
	for i := 0; i < t.used; i++ {
		s := &t.slots[i]
		k := TopKey{Key: string(s.key), Queued: s.count, Error: s.err, QueuedMin: s.count - s.err,
			Uncertain: 2*s.err >= s.count && s.err > 0, Handoffs: s.handoffs, Timeouts: s.timeouts}
		if k.Uncertain && !all {
			uncertain++
			continue
		}
		if s.handoffs > 0 {
			k.MeanWaitS = seconds(s.waitNs) / float64(s.handoffs)
		}
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Queued != out[j].Queued {
			return out[i].Queued > out[j].Queued
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, uncertain
}
