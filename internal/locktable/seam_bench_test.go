package locktable

import (
	"testing"

	"github.com/ticketing/ticketing/wire"
)

// The request path's two ways into the table (internal/server, machine.go): a single node calls
// Requests on the decoded batch; a cluster replica decodes a REQUESTS command (Encoder) in
// Table.Apply. These benchmarks run the same batches both ways, so the cost of a single node
// going through the encoding as well can be read off: each op is one batch of 32 ACQUIREs of
// distinct free keys followed by one batch of their 32 RELEASEs (64 requests).

func seamSetup(b *testing.B) (*Table, Owner, [wire.SessionIDSize]byte, [][]byte) {
	tb := New(Config{})
	sid := [wire.SessionIDSize]byte{1}
	tb.Attach(0, sid, 7, 1e10)
	owner := tb.Outs()[0].Owner
	tb.ClearOuts()
	return tb, owner, sid, makeKeys(32)
}

func seamBatches(keys [][]byte, id uint64, acq, rel []wire.Request, toks []uint64) {
	for k, key := range keys {
		acq[k] = wire.Request{Op: wire.OpAcquire, ID: id + uint64(k), Key: key, Lease: 10000}
		rel[k] = wire.Request{Op: wire.OpRelease, ID: id + 32 + uint64(k), Key: key, Token: toks[k]}
	}
}

func seamTokens(tb *Table, toks []uint64) {
	for k, o := range tb.Outs() {
		toks[k] = o.Resp.Token
	}
	tb.ClearOuts()
}

func BenchmarkSeamDirect(b *testing.B) {
	tb, owner, _, keys := seamSetup(b)
	acq, rel, toks := make([]wire.Request, 32), make([]wire.Request, 32), make([]uint64, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := uint64(i)*64 + 1
		seamBatches(keys, id, acq, rel, toks)
		tb.Requests(int64(i), owner, 7, acq)
		seamTokens(tb, toks)
		seamBatches(keys, id, acq, rel, toks)
		tb.Requests(int64(i), owner, 7, rel)
		tb.ClearOuts()
	}
}

func BenchmarkSeamEncoded(b *testing.B) {
	tb, _, sid, keys := seamSetup(b)
	acq, rel, toks := make([]wire.Request, 32), make([]wire.Request, 32), make([]uint64, 32)
	var enc Encoder
	var scratch []wire.Request
	apply := func(now int64, reqs []wire.Request) {
		enc.Reset(now)
		enc.Requests(&sid, 7)
		for k := range reqs {
			enc.Request(&reqs[k])
		}
		var err error
		if scratch, err = tb.Apply(enc.Bytes(), scratch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := uint64(i)*64 + 1
		seamBatches(keys, id, acq, rel, toks)
		apply(int64(i), acq)
		seamTokens(tb, toks)
		seamBatches(keys, id, acq, rel, toks)
		apply(int64(i), rel)
		tb.ClearOuts()
	}
}

// BenchmarkSeamEncodeOnly is the encoding part of BenchmarkSeamEncoded alone (what a reader
// could do before taking the server's lock); the rest of the difference is Apply's decoding.
func BenchmarkSeamEncodeOnly(b *testing.B) {
	_, _, sid, keys := seamSetup(b)
	acq, rel, toks := make([]wire.Request, 32), make([]wire.Request, 32), make([]uint64, 32)
	var enc Encoder
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		seamBatches(keys, uint64(i)*64+1, acq, rel, toks)
		for _, reqs := range [][]wire.Request{acq, rel} {
			enc.Reset(int64(i))
			enc.Requests(&sid, 7)
			for k := range reqs {
				enc.Request(&reqs[k])
			}
		}
	}
}
