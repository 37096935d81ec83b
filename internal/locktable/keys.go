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
// recycled through a free list. The key's bytes live in Table.keys (keyStore), slot kslot of the
// size class its length klen picks, so an entry holds no pointer: the collector never scans the
// entries, and a key costs its size class (24 bytes for a 20-byte key) instead of a slice
// header and a buffer of its own (24 + 32 bytes).
//
// Fields are ordered to leave no padding (TestEntrySize: 96 bytes): every idle lock pays for
// each byte of it. nwait is 32-bit: 2^31 waiters on one key would take hundreds of gigabytes;
// the holder's lease and queued time are whole milliseconds, as the protocol carries them.
// hash keeps the low 32 bits of the key's hash, which pick the bucket (the index has fewer than
// 2^31 buckets) and spare a lookup the key's bytes (another cache line) for all but the entry
// that matches (without it, lookups went from 8-9% to 11% of the server's CPU at 16 busy
// connections). deadline serves both timers an entry can have, since a held entry is never in
// lock-delay; lprev and lnext serve both lists, since a stalled entry is never held.
type entry struct {
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

	hnext int32 // next entry in the same bucket, or next free entry
	nwait int32

	qhead, qtail int32 // FIFO of waiters (indices into Table.waiters); nwait of them

	orec int32 // held: the holder's owner record, or nilIdx once the owner was dropped
	// The one list an entry can be on: held, its owner's list of held entries (while orec is
	// set); stalled, the table's FIFO of stalled entries. A stalled entry is never held.
	lprev, lnext int32

	kslot int32  // the key's slot in Table.keys
	hash  uint32 // the low 32 bits of the key's hash: they pick the bucket and filter lookups
	klen  uint16 // the key's length (wire.MaxKeyLen is 0xFFFF)
	flags entryFlags
	// held: grant answers addressed to a connection (the hand-off's, retries'), saturating at 2.
	// Undelivered makes a grant revocable only when its one answer was dropped: with two, the
	// client may have read the other.
	answers uint8
}

// entryFlags are an entry's states, one bit each (five bools took five bytes, and the key's
// hash needed four of them).
type entryFlags uint8

const (
	fLive      entryFlags = 1 << iota // in the key index (else on the free list)
	fHeld                             // held by holder, token
	fInDelay                          // in lock-delay until deadline
	fStalled                          // waits for a durable token or horizon; in Table's stalled list
	fRevocable                        // held, granted while its owner was detached (see Table.Revoke)
)

func (e *entry) live() bool      { return e.flags&fLive != 0 }
func (e *entry) held() bool      { return e.flags&fHeld != 0 }
func (e *entry) inDelay() bool   { return e.flags&fInDelay != 0 }
func (e *entry) stalled() bool   { return e.flags&fStalled != 0 }
func (e *entry) revocable() bool { return e.flags&fRevocable != 0 }

// set turns state f on or off.
func (e *entry) set(f entryFlags, on bool) {
	if on {
		e.flags |= f
	} else {
		e.flags &^= f
	}
}

// lookup finds key. It returns the entry index (nilIdx if absent) and the
// key's hash, to be passed to insertKey.
func (t *Table) lookup(key []byte) (int32, uint64) {
	h := maphash.Bytes(t.kseed, key)
	for i := t.kbuckets[h&uint64(len(t.kbuckets)-1)]; i != nilIdx; {
		e := t.entries.at(i)
		if e.hash == uint32(h) && int(e.klen) == len(key) && bytes.Equal(t.keys.get(e.kslot, e.klen), key) {
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
	*e = entry{
		kslot: t.keys.put(key),
		hash:  uint32(h),
		klen:  uint16(len(key)),
		flags: fLive,
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

// key returns a view of entry e's key (see keyStore.get).
func (t *Table) key(e *entry) []byte { return t.keys.get(e.kslot, e.klen) }

// removeKey unlinks entry i from the index and puts it on the free list. Its
// key's bytes stay readable through Event.Key views until insertKey reuses
// their slot.
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
	e.set(fLive, false)
	t.keys.release(e.kslot, e.klen)
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
		if !e.live() {
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

// keySizes are keyStore's size classes: a key takes a slot of the smallest that fits it. Up to
// 256 bytes (the server's default key limit) the steps are a half or a third apart, so a slot
// wastes at most a third of itself; above that, powers of two up to the format's ceiling.
var keySizes = [...]int{8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10}

// keyChunkBytes bounds a key class's chunk: slots per chunk is the largest power of two whose
// slots fit in it (at least one).
const keyChunkBytes = 16 << 10

// keyStore holds the keys' bytes for Table.entries: per size class, fixed-size slots in chunks
// that are allocated once and never move (like slab), and a stack of free slots. The chunks hold
// no pointers and the entries refer to slots by index, so neither is scanned by the collector.
//
// A slot's bytes are written only by put, so a view from get stays valid until that slot is
// given back (release) and taken again by put: the same lifetime a key buffer kept in its entry
// had (Event.Key views are read before the next insert).
type keyStore struct {
	classes [len(keySizes)]keyClass
}

type keyClass struct {
	bits   uint8    // log2 of the slots per chunk
	chunks [][]byte // each (1<<bits)*size bytes
	n      int32    // slots handed out so far (indices 0..n-1)
	free   []int32  // slots given back, reused last in, first out
}

// keyClassOf returns the size class for a key of n bytes (from a table up to 256 bytes: every
// lookup of a key's bytes asks it).
func keyClassOf(n int) int {
	if n < len(smallKeyClass) {
		return int(smallKeyClass[n])
	}
	c := 0
	for keySizes[c] < n {
		c++
	}
	return c
}

var smallKeyClass = func() (t [257]uint8) {
	c := 0
	for n := range t {
		for keySizes[c] < n {
			c++
		}
		t[n] = uint8(c)
	}
	return t
}()

// put copies key into a free slot of its class and returns the slot.
func (s *keyStore) put(key []byte) int32 {
	ci := keyClassOf(len(key))
	c, size := &s.classes[ci], keySizes[ci]
	var slot int32
	if k := len(c.free); k > 0 {
		slot = c.free[k-1]
		c.free = c.free[:k-1]
	} else {
		if c.chunks == nil {
			for (2<<c.bits)*size <= keyChunkBytes {
				c.bits++
			}
		}
		if int(c.n)>>c.bits == len(c.chunks) {
			c.chunks = append(c.chunks, make([]byte, (1<<c.bits)*size))
		}
		slot = c.n
		c.n++
	}
	copy(s.slot(ci, slot), key)
	return slot
}

// slot returns the whole of slot i of class ci.
func (s *keyStore) slot(ci int, i int32) []byte {
	c, size := &s.classes[ci], keySizes[ci]
	off := int(i&(1<<c.bits-1)) * size
	return c.chunks[i>>c.bits][off : off+size : off+size]
}

// get returns a view of the n-byte key in slot i (its capacity ends with the key, so an append
// to it copies instead of writing into the next slot).
func (s *keyStore) get(i int32, n uint16) []byte {
	return s.slot(keyClassOf(int(n)), i)[:n:n]
}

// release gives slot i of an n-byte key back; its bytes stay as they are until put reuses it.
func (s *keyStore) release(i int32, n uint16) {
	c := &s.classes[keyClassOf(int(n))]
	c.free = append(c.free, i)
}
