package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Workloads on 3-member clusters: Ticketing (Raft) beside etcd, in the same run.
//
//	cluster   throughput (pipelined, several connections, as (a)) and one-at-a-time latency (as
//	          (b), acquires timed alone), every point on a freshly started cluster
//	failover  kill the leader under a looping client, trials times per system

func (b *bench) clusterSystems() []string {
	var out []string
	for _, s := range []string{"ticketing", "etcd"} {
		if has(b.o.systems, s) {
			out = append(out, s)
		}
	}
	return out
}

// startCluster starts a fresh cluster of sys in a new temp dir.
func (b *bench) startCluster(sys string) (cluster, error) {
	o := b.o
	b.mu.Lock()
	b.seq++
	dir := filepath.Join(b.tmp, fmt.Sprintf("%s-cluster-%d", sys, b.seq))
	b.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var cl cluster
	var err error
	switch sys {
	case "ticketing":
		cl, err = startTicketingCluster(o.tkBin, dir, o.clusterNodes, o.raftTiming, o.raftStore, o.tkEnv)
	case "etcd":
		cl, err = startEtcdCluster(dir, o.clusterNodes)
	default:
		err = fmt.Errorf("no cluster of %s", sys)
	}
	if err != nil {
		return nil, fmt.Errorf("starting a %d-member %s cluster: %w", o.clusterNodes, sys, err)
	}
	b.mu.Lock()
	b.clusters = append(b.clusters, cl)
	b.mu.Unlock()
	return cl, nil
}

func (b *bench) stopCluster(cl cluster) {
	cl.stop()
	b.mu.Lock()
	for i, c := range b.clusters {
		if c == cl {
			b.clusters = append(b.clusters[:i], b.clusters[i+1:]...)
			break
		}
	}
	b.mu.Unlock()
}

func (b *bench) clusterNote(sys string) string {
	o := b.o
	if sys == "etcd" {
		return fmt.Sprintf("%d etcd members, default settings (fsync, heartbeat 100 ms, election 1 s)", o.clusterNodes)
	}
	store := o.raftStore
	if store == "" {
		store = "wal (default)"
	}
	return fmt.Sprintf("%d Ticketing nodes, TICKETING_RAFT_TIMING=%s, raft store %s", o.clusterNodes, o.raftTiming, store)
}

func (b *bench) workloadCluster() error {
	o := b.o
	keys := makeKeys("key", o.keys)
	thr := map[string][]*pointResult{}
	lat := map[string][]*pointResult{}
	failed := map[string][]string{}
	for rep := 0; rep < o.repeat; rep++ {
		for _, sys := range b.clusterSystems() {
			cl, err := b.startCluster(sys)
			if err != nil {
				return err
			}
			res, lres, err := b.clusterPoints(cl, keys)
			b.stopCluster(cl)
			if err != nil {
				// A leader change under load ends a point; the run goes on without it.
				logf("(cluster) run %d/%d  %s: %v", rep+1, o.repeat, sys, err)
				failed[sys] = append(failed[sys], err.Error())
				continue
			}
			logf("(cluster) run %d/%d  %-9s %d nodes  conns=%d depth=%d  %10.0f ops/s  |  one at a time: acquire p50 %7.1f us  p99 %8.1f us",
				rep+1, o.repeat, sys, o.clusterNodes, o.clusterConns, o.depth, res.opsPerSec(),
				us(lres.acqHist.ValueAtQuantile(50)), us(lres.acqHist.ValueAtQuantile(99)))
			thr[sys] = append(thr[sys], res)
			lat[sys] = append(lat[sys], lres)
		}
	}
	for _, sys := range b.clusterSystems() {
		runs := thr[sys]
		if len(runs) == 0 {
			for _, wl := range []string{"cluster_pipelined", "cluster_latency"} {
				b.records = append(b.records, &Record{System: sys, Workload: wl, Nodes: o.clusterNodes,
					Skipped: "every run failed: " + strings.Join(failed[sys], "; ")})
			}
			continue
		}
		sorted := append([]*pointResult(nil), runs...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].opsPerSec() < sorted[j].opsPerSec() })
		r := b.pointRecord(sys, "cluster_pipelined", o.clusterConns, o.depth, o.keys, sorted[len(sorted)/2])
		r.OpsPerSec = median(runs)
		for _, x := range runs {
			r.Runs = append(r.Runs, round1(x.opsPerSec()))
		}
		r.RunsMetric = "ops_per_sec"
		r.OpsCounting = "one acquire+release pair = 2 ops"
		r.Nodes = o.clusterNodes
		r.Note = b.clusterNote(sys) + "; RSS and latency of the leader's process, CPU of all members"
		if len(failed[sys]) > 0 {
			r.Note += fmt.Sprintf("; %d runs failed: %s", len(failed[sys]), strings.Join(failed[sys], "; "))
		}
		if sys == "etcd" {
			r.Note += fmt.Sprintf("; concurrency.Mutex cannot pipeline: %d clients x %d goroutines", o.clusterConns, o.depth)
		}
		b.records = append(b.records, r)

		acqP50 := func(p *pointResult) float64 { return us(p.acqHist.ValueAtQuantile(50)) }
		med, all := medianRun(lat[sys], acqP50)
		lr := b.pointRecord(sys, "cluster_latency", 1, 1, o.keys, med)
		lr.AcqP50us = round1(us(med.acqHist.ValueAtQuantile(50)))
		lr.AcqP99us = round1(us(med.acqHist.ValueAtQuantile(99)))
		lr.AcqP999us = round1(us(med.acqHist.ValueAtQuantile(99.9)))
		lr.Runs = all
		lr.RunsMetric = "acquire_p50_us"
		lr.OpsCounting = "acquire and release each 1 op; p50/p99: both; acquire_p50/p99: acquires alone"
		lr.Nodes = o.clusterNodes
		lr.Note = b.clusterNote(sys)
		b.records = append(b.records, lr)
	}
	return nil
}

// clusterPoints measures throughput, then one-at-a-time latency, on a running cluster.
func (b *bench) clusterPoints(cl cluster, keys [][]byte) (*pointResult, *pointResult, error) {
	o := b.o
	kind := cl.system()
	lead, err := cl.leader(30 * time.Second)
	if err != nil {
		return nil, nil, err
	}
	addr, err := cl.clientAddr()
	if err != nil {
		return nil, nil, err
	}
	ws, err := pipelineWorkersAt(kind, addr, o.clusterConns, o.depth, keys, "", false)
	if err != nil {
		return nil, nil, err
	}
	res, err := runPoint(cl.target(lead), ws, o.warmup, o.duration, o.drain, false)
	if err != nil {
		return nil, nil, fmt.Errorf("throughput: %w", err)
	}
	ws, err = pipelineWorkersAt(kind, addr, 1, 1, keys, "", false)
	if err != nil {
		return nil, nil, err
	}
	lres, err := runPoint(cl.target(lead), ws, o.warmup, o.duration, o.drain, true)
	if err != nil {
		return nil, nil, fmt.Errorf("latency: %w", err)
	}
	return res, lres, nil
}

func (b *bench) workloadFailover() error {
	o := b.o
	for _, sys := range b.clusterSystems() {
		cl, err := b.startCluster(sys)
		if err != nil {
			return err
		}
		var c foClient
		switch sys {
		case "ticketing":
			c, err = newFoTicketing(cl.(*tkCluster).endpoints())
		case "etcd":
			c, err = newFoEtcd(cl.(*etcdCluster).endpoints(), o.etcdAttempt)
		}
		if err != nil {
			b.stopCluster(cl)
			return fmt.Errorf("failover %s: client: %w", sys, err)
		}
		trials, err := runFailover(cl, c, o.failoverTrials, 30*time.Second)
		var summary string
		if tc, ok := c.(*foTicketing); ok {
			summary = tc.summary()
		}
		c.close()
		b.stopCluster(cl)
		if err != nil {
			logf("failover %s: %v (after %d trials)", sys, err, len(trials))
			if len(trials) == 0 {
				return fmt.Errorf("failover %s: %w", sys, err)
			}
		}
		r := &Record{System: sys, Workload: "cluster_failover", Connections: 1, Pipeline: 1, Nodes: o.clusterNodes}
		r.FailoverMs, r.FailoverMedianMs, r.FailoverMinMs, r.FailoverMaxMs, r.FailoverFailed = failoverStats(trials)
		r.Runs, r.RunsMetric = r.FailoverMs, "failover_ms"
		r.OpsCounting = "ms from SIGKILL of the leader to the looping client's next successful acquire"
		var how string
		switch sys {
		case "ticketing":
			how = fmt.Sprintf("one session acquiring (try once) and releasing new keys in a loop; on a dropped connection it reconnects (leader hint first, then each node, %v between rounds) and resumes its session, re-sending the request it awaited; counts the first acquire answered on a connection made after the kill", foReconnectPause)
		case "etcd":
			how = fmt.Sprintf("one client (every endpoint) and session locking and unlocking new keys with concurrency.Mutex, each call bounded by %v and retried at once; counts the first Lock started after the kill", o.etcdAttempt)
		}
		r.Note = b.clusterNote(sys) + "; " + how
		if summary != "" {
			r.Note += "; the client: " + summary
		}
		if err != nil {
			r.Note += "; stopped early: " + err.Error()
		}
		if len(trials) > 0 {
			var who []string
			for _, t := range trials {
				who = append(who, fmt.Sprintf("%d->%d", t.killed+1, t.newLeader+1))
			}
			r.Note += "; leader killed -> new leader: " + strings.Join(who, " ")
		}
		b.records = append(b.records, r)
		logf("failover %-9s median %.0f ms (min %.0f, max %.0f) over %d trials, %d without a success",
			sys, r.FailoverMedianMs, r.FailoverMinMs, r.FailoverMaxMs, len(trials), r.FailoverFailed)
	}
	return nil
}
