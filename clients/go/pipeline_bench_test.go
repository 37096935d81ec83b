package ticketing

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// The pipelined-pairs benchmark of the harness's clients workload (bench/clients.go, the program
// bench/goclient), reproducible without the harness: N goroutines share one Client (one
// connection), each on its own key, each looping TryAcquire (lease 30 s) + Lock.Release. One
// benchmark op is one acquire+release pair, so allocs/op is allocations per pair; pairs/s is
// reported too. BenchmarkPipelinedPairsRaw is the reference on the same server: the harness's
// raw driver (one goroutine, N slots, every answer read in one go handled and the requests it
// causes written in one write), so the ratio client/raw shows what the library costs.
//
//	go test -run '^$' -bench 'PipelinedPairs' -benchtime 2s . (in clients/go)
//
// Besides pairs/s, each reports the process's CPU time per pair (cpu-us/pair: the client's cost,
// the server being another process) and its read and write syscalls per pair (from
// /proc/self/io). The client and the server share the machine: compare variants by ratios of
// interleaved runs, and prefer cpu-us/pair to pairs/s on a machine that runs other work.

var pipelineDepths = []int{64, 1}

func BenchmarkPipelinedPairs(b *testing.B) {
	for _, n := range pipelineDepths {
		b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) { benchPipelinedPairs(b, n) })
	}
}

func benchPipelinedPairs(b *testing.B, inFlight int) {
	c, err := Dial(context.Background(), WithEndpoints(sharedAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	prefix := fmt.Sprintf("bench-pairs/%d", time.Now().UnixNano())
	var left atomic.Int64
	left.Store(int64(b.N))
	var errs atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	r0, w0 := syscallCounts()
	cpu0 := processCPU()
	start := time.Now()
	for w := 0; w < inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%s/%d", prefix, w)
			for left.Add(-1) >= 0 {
				lk, err := c.TryAcquire(ctx, key, 30*time.Second)
				if err != nil || lk == nil {
					errs.Add(1)
					continue
				}
				if err := lk.Release(ctx); err != nil {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	if n := errs.Load(); n > 0 {
		b.Fatalf("%d pairs failed", n)
	}
	b.ReportMetric(float64(b.N)/took.Seconds(), "pairs/s")
	reportSyscalls(b, r0, w0)
	reportCPU(b, cpu0)
}

// reportCPU reports this process's CPU time per pair since cpu0: the client's cost (the server is
// another process), which, unlike pairs/s, does not depend on what else the machine runs.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu0 < 0 {
		return
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/pair")
}

// syscallCounts reads the process's read and write syscall counts (Linux; -1 elsewhere).
func syscallCounts() (reads, writes int64) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1, -1
	}
	reads, writes = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// reportSyscalls reports the read and write syscalls per pair since r0, w0.
func reportSyscalls(b *testing.B, r0, w0 int64) {
	r1, w1 := syscallCounts()
	if r0 < 0 || r1 < 0 {
		return
	}
	b.ReportMetric(float64(r1-r0)/float64(b.N), "reads/pair")
	b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/pair")
}

func BenchmarkPipelinedPairsRaw(b *testing.B) {
	for _, n := range pipelineDepths {
		b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) { benchPipelinedPairsRaw(b, n) })
	}
}

// benchPipelinedPairsRaw drives one handshaken connection by hand, as bench/drivers.go's tkPipe.
func benchPipelinedPairsRaw(b *testing.B, inFlight int) {
	c := &Client{opts: defaultOptions()}
	c.opts.endpoints = []string{sharedAddr}
	var session [wire.SessionIDSize]byte
	newSessionID(&session)
	nc, _, err := c.dialEndpoint(context.Background(), sharedAddr, &session)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	prefix := fmt.Sprintf("bench-raw/%d", time.Now().UnixNano())
	type slot struct {
		key     []byte
		id      uint64
		release bool
	}
	slots := make([]slot, inFlight)
	owner := map[uint64]int{}
	var nextID uint64
	var wbuf []byte
	send := func(i int, op wire.Op, token uint64) {
		s := &slots[i]
		nextID++
		s.id, s.release = nextID, op == wire.OpRelease
		owner[nextID] = i
		r := wire.Request{Op: op, ID: nextID, Token: token, Key: s.key}
		if op == wire.OpAcquire {
			r.Lease = 30000
		}
		wbuf = wire.AppendRequest(wbuf, &r)
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	var rbuf []byte
	var resp wire.Response
	answers, pairs, started, ackID := 0, 0, 0, uint64(0)
	b.ReportAllocs()
	b.ResetTimer()
	r0, w0 := syscallCounts()
	cpu0 := processCPU()
	start := time.Now()
	for i := range slots {
		slots[i].key = fmt.Appendf(nil, "%s/%d", prefix, i)
		if started < b.N {
			started++
			send(i, wire.OpAcquire, 0)
		}
	}
	for active := started; active > 0; {
		if len(wbuf) > 0 && br.Buffered() < wire.HeaderSize {
			if _, err := nc.Write(wbuf); err != nil {
				b.Fatal(err)
			}
			wbuf = wbuf[:0]
		}
		rbuf, err = readResponse(br, rbuf, wire.MaxDataLen, &resp)
		if err != nil {
			b.Fatal(err)
		}
		if resp.ID == ackID && resp.Op == wire.OpAck {
			ackID = 0
			continue
		}
		i, ok := owner[resp.ID]
		if !ok || resp.Status != wire.StatusOK {
			b.Fatalf("answer %v %v to id %d", resp.Op, resp.Status, resp.ID)
		}
		delete(owner, resp.ID)
		if answers++; answers >= wire.AckEvery && ackID == 0 {
			low := nextID + 1
			for _, s := range slots {
				if s.release && s.id < low {
					low = s.id
				}
			}
			nextID++
			ackID, answers = nextID, 0
			wbuf = wire.AppendRequest(wbuf, &wire.Request{Op: wire.OpAck, ID: nextID, Token: low})
		}
		if !slots[i].release {
			send(i, wire.OpRelease, resp.Token)
			continue
		}
		slots[i].release = false
		pairs++
		if started < b.N {
			started++
			send(i, wire.OpAcquire, 0)
		} else {
			active--
		}
	}
	took := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(pairs)/took.Seconds(), "pairs/s")
	reportSyscalls(b, r0, w0)
	reportCPU(b, cpu0)
}
