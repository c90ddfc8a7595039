package main

import (
	"fmt"
	"io"
	"time"
)

// A transport variant of fusebox under test: its gRPC server (-grpc-server)
// and its ext_proc listener.
type variant struct {
	Server, Listener string
}

// The variants make bench-wire measures, in one run: fusebox's own
// transport (the default) and grpc-go's, each over loopback TCP and over
// a Unix socket (the shipped sidecars' pipe address).
var variants = []variant{
	{"fusebox", tcpListener}, {"fusebox", unixListener},
	{"grpc-go", tcpListener}, {"grpc-go", unixListener},
}

// TransportReport holds, per variant, fusebox's CPU per lifecycle over the
// null server's (grpc-go over TCP, the same process for every variant) in
// each round, for the synchronous and the observer profile.
type TransportReport struct {
	Variants        []variant
	Sync, Observer  [][]float64 // [variant][round]
	SyncCPU, ObsCPU []time.Duration
	Requests        int
}

// Transports measures every variant against one null server in the same
// alternating rounds. Each round rotates the order, so no variant is
// always measured first or last.
func Transports(bin, nullBin string, requests, rounds, conc int) (*TransportReport, error) {
	nl, err := startNull(nullBin)
	if err != nil {
		return nil, err
	}
	defer nl.stop()
	type pair struct{ sync, obs *proc }
	ps := make([]pair, len(variants))
	for i, v := range variants {
		s, err := startFuseboxOn(bin, v.Listener, "-grpc-server", v.Server)
		if err != nil {
			return nil, err
		}
		defer s.stop()
		o, err := startFuseboxObserverOn(bin, v.Listener, "-grpc-server", v.Server)
		if err != nil {
			return nil, err
		}
		defer o.stop()
		o.observer = true
		ps[i] = pair{s, o}
	}
	all := []*proc{nl}
	for _, p := range ps {
		all = append(all, p.sync, p.obs)
	}
	l := newLifecycle()
	for _, p := range all { // warm up
		if _, err := p.drive(l, 200, conc, nil); err != nil {
			return nil, err
		}
	}
	rep := &TransportReport{Variants: variants, Sync: make([][]float64, len(variants)), Observer: make([][]float64, len(variants)),
		SyncCPU: make([]time.Duration, len(variants)), ObsCPU: make([]time.Duration, len(variants)), Requests: requests * rounds}
	for r := 0; r < rounds; r++ {
		cpu := make([]time.Duration, len(all))
		for k := range all {
			i := (k + r) % len(all)
			p := all[i]
			c0, err := procCPU(p.cmd.Process.Pid)
			if err != nil {
				return nil, err
			}
			if _, err := p.drive(l, requests, conc, nil); err != nil {
				return nil, err
			}
			c1, _ := procCPU(p.cmd.Process.Pid)
			cpu[i] = c1 - c0
		}
		if cpu[0] == 0 {
			continue
		}
		for i := range variants {
			s, o := cpu[1+2*i], cpu[2+2*i]
			rep.Sync[i] = append(rep.Sync[i], float64(s)/float64(cpu[0]))
			rep.Observer[i] = append(rep.Observer[i], float64(o)/float64(cpu[0]))
			rep.SyncCPU[i] += s
			rep.ObsCPU[i] += o
		}
	}
	return rep, nil
}

// Print writes one line per variant: the median ratio to the null server
// and the CPU per lifecycle, synchronous and observer.
func (rep *TransportReport) Print(w io.Writer) {
	fmt.Fprintf(w, "transports (fusebox's CPU per lifecycle over the null server's, grpc-go on TCP; medians of %d paired rounds)\n", len(rep.Sync[0]))
	fmt.Fprintf(w, "%-9s %-9s %10s %12s %10s %12s\n", "server", "listener", "sync/null", "sync cpu", "obs/null", "obs cpu")
	for i, v := range rep.Variants {
		n := time.Duration(max(rep.Requests, 1))
		fmt.Fprintf(w, "%-9s %-9s %9.2fx %12v %9.2fx %12v\n", v.Server, v.Listener,
			median(rep.Sync[i]), (rep.SyncCPU[i] / n).Round(100*time.Nanosecond),
			median(rep.Observer[i]), (rep.ObsCPU[i] / n).Round(100*time.Nanosecond))
	}
}
