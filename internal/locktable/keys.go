package locktable

import (
	"bytes"
	"hash/maphash"
)

// nilIdx marks the end of an intrusive list or an absent slot.
const nilIdx int32 = -1

// minBuckets is the initial size of every hash index (a power of two).
const minBuckets = 64

// entry is the state of one key. Entries live in Table.entries and are
// recycled through a free list; an entry keeps its key buffer when recycled so
// that a new key of similar length is copied without allocating.
//
// Fields are ordered to leave no padding (TestEntrySize: 128 bytes): every idle lock pays for
// each byte of it. nwait is 32-bit: 2^31 waiters on one key would take hundreds of gigabytes;
// the holder's lease and queued time are whole milliseconds, as the protocol carries them.
// hash keeps the low 32 bits of the key's hash, which pick the bucket (the index has fewer than
// 2^31 buckets) and filter the key comparison. deadline serves both timers an entry can have,
// since a held entry is never in lock-delay.
type entry struct {
	key []byte

	holder    Owner
	holderReq uint64
	token     uint64
	grantedAt int64
	deadline  int64  // held: the lease's end; inDelay: the lock-delay's end; else unused
	tseq      uint64 // seq of the live lease (held) or delay (inDelay) timer; 0 if none

	// held: the lease the holder's acquire asked for, in ms (retries are compared with it), and
	// the ms it spent queued before the grant (a retry's answer counts from its first arrival).
	holderLeaseMs uint32
	queuedMs      uint32

	hash  uint32
	hnext int32 // next entry in the same bucket, or next free entry
	nwait int32

	qhead, qtail int32 // FIFO of waiters (indices into Table.waiters); nwait of them

	orec           int32 // held: the holder's owner record, or nilIdx once the owner was dropped
	ohprev, ohnext int32 // held: the owner's list of held entries
	sprev, snext   int32 // stalled: the table's FIFO of stalled entries

	live      bool
	held      bool
	inDelay   bool
	stalled   bool // waits for a durable token or horizon; in Table's stalled list
	revocable bool // held, granted while its owner was detached (see Table.Revoke)
	// held: grant answers addressed to a connection (the hand-off's, retries'), saturating at 2.
	// Undelivered makes a grant revocable only when its one answer was dropped: with two, the
	// client may have read the other.
	answers uint8
}

// lookup finds key. It returns the entry index (nilIdx if absent) and the
// key's hash, to be passed to insertKey.
func (t *Table) lookup(key []byte) (int32, uint64) {
	h := maphash.Bytes(t.kseed, key)
	for i := t.kbuckets[h&uint64(len(t.kbuckets)-1)]; i != nilIdx; {
		e := t.entries.at(i)
		if e.hash == uint32(h) && bytes.Equal(e.key, key) {
			return i, h
		}
		i = e.hnext
	}
	return nilIdx, h
}

// insertKey adds an idle entry for key (which must be absent; h its hash).
func (t *Table) insertKey(key []byte, h uint64) int32 {
	if t.nkeys >= len(t.kbuckets) {
		t.growKeys()
	}
	var i int32
	if t.freeE != nilIdx {
		i = t.freeE
		t.freeE = t.entries.at(i).hnext
	} else {
		i = t.entries.add()
	}
	e := t.entries.at(i)
	buf := e.key
	if cap(buf) < len(key) {
		buf = make([]byte, len(key), keyCap(len(key)))
	}
	buf = buf[:len(key)]
	copy(buf, key)
	*e = entry{
		key:   buf,
		hash:  uint32(h),
		live:  true,
		qhead: nilIdx,
		qtail: nilIdx,
		orec:  nilIdx,
	}
	b := h & uint64(len(t.kbuckets)-1)
	e.hnext = t.kbuckets[b]
	t.kbuckets[b] = i
	t.nkeys++
	return i
}

// keyCap rounds a key buffer's capacity up (power of two, at least 16), so
// that recycled entries rarely need a new buffer.
func keyCap(n int) int {
	c := 16
	for c < n {
		c <<= 1
	}
	return c
}

// removeKey unlinks entry i from the index and puts it on the free list. Its
// key buffer is kept (and stays readable through Event.Key views) until the
// entry is reused by insertKey.
func (t *Table) removeKey(i int32) {
	e := t.entries.at(i)
	b := uint64(e.hash) & uint64(len(t.kbuckets)-1)
	if t.kbuckets[b] == i {
		t.kbuckets[b] = e.hnext
	} else {
		p := t.kbuckets[b]
		for t.entries.at(p).hnext != i {
			p = t.entries.at(p).hnext
		}
		t.entries.at(p).hnext = e.hnext
	}
	e.live = false
	e.hnext = t.freeE
	t.freeE = i
	t.nkeys--
}

// growKeys doubles the bucket array and relinks every live entry.
func (t *Table) growKeys() {
	nb := newBuckets(2 * len(t.kbuckets))
	mask := uint64(len(nb) - 1)
	for i := int32(0); i < t.entries.n; i++ {
		e := t.entries.at(i)
		if !e.live {
			continue
		}
		b := uint64(e.hash) & mask
		e.hnext = nb[b]
		nb[b] = int32(i)
	}
	t.kbuckets = nb
}

func newBuckets(n int) []int32 {
	b := make([]int32, n)
	for i := range b {
		b[i] = nilIdx
	}
	return b
}
