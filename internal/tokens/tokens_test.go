package tokens

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func stored(t *testing.T, dir string) uint64 {
	t.Helper()
	l, err := readLimit(filepath.Join(dir, fileName))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustOpen(t *testing.T, dir string, block uint64) *Allocator {
	t.Helper()
	a, err := Open(dir, block)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return a
}

func TestFreshDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b") // created by Open
	a := mustOpen(t, dir, 0)
	defer a.Close()
	if a.Last() != 0 {
		t.Fatalf("Last %d", a.Last())
	}
	if got := stored(t, dir); got != DefaultBlock {
		t.Fatalf("stored limit %d, want %d (reserved before the first token)", got, DefaultBlock)
	}
	for want := uint64(1); want <= 5; want++ {
		if got := a.Next(); got != want {
			t.Fatalf("Next %d, want %d", got, want)
		}
	}
	if a.Last() != 5 || a.Err() != nil {
		t.Fatalf("Last %d Err %v", a.Last(), a.Err())
	}
}

func TestReopenAfterClose(t *testing.T) {
	dir := t.TempDir()
	var max uint64
	for round := 0; round < 6; round++ {
		a := mustOpen(t, dir, 8)
		first := a.Next()
		if first <= max {
			t.Fatalf("round %d: first token %d <= %d seen before", round, first, max)
		}
		max = first
		for i := 0; i < round*7; i++ {
			tok := a.Next()
			if tok != max+1 {
				t.Fatalf("token %d after %d", tok, max)
			}
			max = tok
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if l := stored(t, dir); l < max {
			t.Fatalf("stored limit %d below handed-out token %d", l, max)
		}
	}
}

func TestCorruptFileIsAnError(t *testing.T) {
	good := encodeLimit(12345)
	badVersion := bytes.Clone(good)
	binary.LittleEndian.PutUint32(badVersion[4:8], 2)
	binary.LittleEndian.PutUint32(badVersion[16:20], crc32.Checksum(badVersion[:16], castagnoli))
	flipped := bytes.Clone(good)
	flipped[9] ^= 0x40 // limit changed, checksum not
	badMagic := bytes.Clone(good)
	copy(badMagic, "XXXX")
	badMagic2 := bytes.Clone(badMagic)
	binary.LittleEndian.PutUint32(badMagic2[16:20], crc32.Checksum(badMagic2[:16], castagnoli))
	cases := map[string][]byte{
		"empty":       {},
		"truncated":   good[:10],
		"trailing":    append(bytes.Clone(good), 0),
		"bit flip":    flipped,
		"bad magic":   badMagic,
		"bad magic 2": badMagic2,
		"bad version": badVersion,
		"text":        []byte("12345678901234567890"),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, fileName)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			a, err := Open(dir, 8)
			if !errors.Is(err, ErrCorrupt) {
				if a != nil {
					a.Close()
				}
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, data) {
				t.Fatal("corrupt file was modified")
			}
			// The lock was released: after a repair, Open works.
			if err := os.WriteFile(path, good, 0o600); err != nil {
				t.Fatal(err)
			}
			a = mustOpen(t, dir, 8)
			defer a.Close()
			if tok := a.Next(); tok != 12346 {
				t.Fatalf("after repair: %d", tok)
			}
		})
	}
}

func TestConcurrentNextUnique(t *testing.T) {
	for _, block := range []uint64{3, 16, 1024} {
		t.Run(fmt.Sprint("block", block), func(t *testing.T) {
			dir := t.TempDir()
			a := mustOpen(t, dir, block)
			const workers = 8
			per := 3000
			if block < 100 {
				per = 400 // every block is an fsync
			}
			got := make([][]uint64, workers)
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := make([]uint64, per)
					for i := range s {
						s[i] = a.Next()
					}
					got[w] = s
				}()
			}
			wg.Wait()
			seen := make(map[uint64]bool, workers*per)
			var max uint64
			for _, s := range got {
				for i, tok := range s {
					if i > 0 && tok <= s[i-1] {
						t.Fatalf("not increasing within a goroutine: %d after %d", tok, s[i-1])
					}
					if seen[tok] {
						t.Fatalf("token %d handed out twice", tok)
					}
					seen[tok] = true
					max = maxU(max, tok)
				}
			}
			if max != uint64(workers*per) || a.Last() != max {
				t.Fatalf("max %d Last %d, want %d", max, a.Last(), workers*per)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if l := stored(t, dir); l < max {
				t.Fatalf("stored limit %d < %d", l, max)
			}
		})
	}
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

func (a *Allocator) setPersist(f func(uint64) error) {
	a.mu.Lock()
	a.persist = f
	a.mu.Unlock()
}

func TestPersistFailureBlocksAndHeals(t *testing.T) {
	dir := t.TempDir()
	a := mustOpen(t, dir, 4) // durable limit 4
	defer a.Close()
	failures := make(chan uint64, 1000)
	a.setPersist(func(limit uint64) error {
		failures <- limit
		return errors.New("disk on fire")
	})
	for want := uint64(1); want <= 4; want++ {
		if got := a.Next(); got != want {
			t.Fatalf("Next %d want %d", got, want)
		}
	}
	done := make(chan uint64)
	go func() { done <- a.Next() }()
	// The background reservation keeps failing and retrying...
	for i := 0; i < 3; i++ {
		select {
		case l := <-failures:
			if l != 8 {
				t.Fatalf("reserving %d, want 8", l)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no retry")
		}
	}
	if err := a.Err(); err == nil {
		t.Fatal("Err() nil during failure")
	}
	// ... and Next must not hand out an unpersisted token.
	select {
	case tok := <-done:
		t.Fatalf("Next returned %d beyond the durable limit", tok)
	case <-time.After(50 * time.Millisecond):
	}
	if l := stored(t, dir); l != 4 {
		t.Fatalf("stored %d", l)
	}
	a.setPersist(a.writeLimit)
	select {
	case tok := <-done:
		if tok != 5 {
			t.Fatalf("after healing: %d", tok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next still blocked after the disk healed")
	}
	if a.Err() != nil {
		t.Fatalf("Err after success: %v", a.Err())
	}
	if l := stored(t, dir); l != 8 {
		t.Fatalf("stored %d, want 8", l)
	}
}

func TestOpenFailsIfFirstPersistFails(t *testing.T) {
	dir := t.TempDir()
	a := mustOpen(t, dir, 4)
	a.Close()
	// A directory where the temporary file goes makes every write fail,
	// even for root.
	if err := os.Mkdir(filepath.Join(dir, fileName+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	if a, err := Open(dir, 4); err == nil {
		a.Close()
		t.Fatal("Open succeeded although the limit could not be persisted")
	}
	if l := stored(t, dir); l != 4 {
		t.Fatalf("stored %d", l)
	}
	// The failed Open released the lock.
	os.Remove(filepath.Join(dir, fileName+".tmp"))
	a = mustOpen(t, dir, 4)
	defer a.Close()
	if tok := a.Next(); tok != 5 {
		t.Fatalf("Next %d", tok)
	}
}

func TestNextDoesNotAllocate(t *testing.T) {
	a := mustOpen(t, t.TempDir(), 0)
	defer a.Close()
	if n := testing.AllocsPerRun(10000, func() { a.Next() }); n != 0 {
		t.Fatalf("%v allocs per Next", n)
	}
}

func TestNextAfterClosePanics(t *testing.T) {
	a := mustOpen(t, t.TempDir(), 4)
	a.Next()
	a.Close()
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	a.Next()
}

func TestExhaustion(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, fileName), encodeLimit(math.MaxUint64-3), 0o600); err != nil {
		t.Fatal(err)
	}
	a := mustOpen(t, dir, 10)
	for i := uint64(2); ; i-- {
		if tok := a.Next(); tok != math.MaxUint64-i {
			t.Fatalf("Next %d", tok)
		}
		if i == 0 {
			break
		}
	}
	done := make(chan any)
	go func() {
		defer func() { done <- recover() }()
		a.Next()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !errors.Is(a.Err(), ErrExhausted) {
		if time.Now().After(deadline) {
			t.Fatalf("Err %v", a.Err())
		}
		time.Sleep(time.Millisecond)
	}
	a.Close()
	if r := <-done; r == nil {
		t.Fatal("blocked Next returned after Close instead of panicking")
	}
	if _, err := Open(dir, 10); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Open at the end of the token space: %v", err)
	}
}

func BenchmarkNext(b *testing.B) {
	a, err := Open(b.TempDir(), 0)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		a.Next()
	}
}
