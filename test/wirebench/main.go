package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

func main() {
	fusebox := flag.String("fusebox", "bin/extproc", "fusebox binary")
	null := flag.String("null", "bin/nullproc", "null CONTINUE server binary")
	requests := flag.Int("requests", 2000, "lifecycles per round and server")
	rounds := flag.Int("rounds", 9, "alternating rounds")
	conc := flag.Int("concurrency", 32, "concurrent streams")
	wait := flag.Bool("wait-chunks", false, "send each response chunk only once the previous one's reply came (default: pipelined, as Envoy sends them)")
	accessLog := flag.Bool("access-log", true, "keep an access log channel stream connected to fusebox, as the shipped Envoy configs do")
	env := flag.String("fusebox-env", "", "space-separated NAME=value pairs added to fusebox's environment (GOGC=100: the collector as Go sets it, not fusebox)")
	profile := flag.String("profile", "", "instead of measuring: drive each fusebox process (sync, observer) for 10 s and write its CPU profile (from the admin's /debug/pprof) into this directory")
	gap := flag.Duration("chunk-gap", 0, "the observer profile's chunks are sent this far apart, as an upstream streams tokens (default: back to back)")
	compare := flag.String("compare", "", "instead of the null servers: measure this second fusebox binary against -fusebox in the same rounds, both profiles, and print its CPU ratio to it")
	transports := flag.Bool("transports", false, "instead of the null servers' table: fusebox on its own transport and on grpc-go's, each over TCP and a Unix socket, both profiles, as ratios to one null server in the same rounds")
	flag.Parse()
	waitChunks, withAccessLog, fuseboxEnv, chunkGap = *wait, *accessLog, strings.Fields(*env), *gap
	if *profile != "" {
		if err := Profile(*fusebox, *profile, *conc); err != nil {
			fmt.Fprintln(os.Stderr, "wirebench:", err)
			os.Exit(1)
		}
		return
	}
	if *transports {
		rep, err := Transports(*fusebox, *null, *requests, *rounds, *conc)
		if err != nil {
			fmt.Fprintln(os.Stderr, "wirebench:", err)
			os.Exit(1)
		}
		rep.Print(os.Stdout)
		return
	}
	if *compare != "" {
		if _, _, err := Compare(*fusebox, *compare, *requests, *rounds, *conc, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "wirebench:", err)
			os.Exit(1)
		}
		return
	}
	rep, err := Run(*fusebox, *null, *requests, *rounds, *conc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirebench:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
}

// Result is one server's figures.
type Result struct {
	Name      string
	Requests  int
	CPU       time.Duration // server process CPU
	Latencies []time.Duration
	WallClock time.Duration
	Messages  int
	// Reads and Writes are the server's read and write system calls
	// (/proc/<pid>/io syscr, syscw): on loopback a write also pays for
	// the peer's TCP receive path, so they are a large part of its CPU.
	Reads, Writes int64
}

// SyscallsPerRequest is the server's reads and writes per lifecycle.
func (r *Result) SyscallsPerRequest() (reads, writes float64) {
	if r.Requests == 0 {
		return 0, 0
	}
	return float64(r.Reads) / float64(r.Requests), float64(r.Writes) / float64(r.Requests)
}

// CPUPerRequest is the server's CPU per lifecycle.
func (r *Result) CPUPerRequest() time.Duration { return r.CPU / time.Duration(r.Requests) }

// Pct returns the p-th percentile message latency.
func (r *Result) Pct(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	slices.Sort(r.Latencies)
	return r.Latencies[int(p*float64(len(r.Latencies)-1))]
}

// Report is both servers' figures.
type Report struct {
	Null, Fusebox *Result
	// Observer is fusebox in the observer profile (observer.go), driven as
	// envoy-observer.yaml drives it; ObserverRatios its per-round CPU over
	// the null (synchronous) server's.
	Observer       *Result
	ObserverRatios []float64
	// NullTuned is the null server on fusebox's own transport
	// (pkg/grpcwire, nullproc -wire), and the Tuned ratios are
	// fusebox's and the observer's CPU over it, per round: what fusebox's
	// own work costs, its transport aside.
	NullTuned                  *Result
	TunedRatios, ObserverTuned []float64
	// NullObserver is the null server playing the observer profile
	// (nullproc -observer: the 2 request-phase replies, no reply to the 51
	// observed messages), and ObserverNullObs fusebox's observer CPU over
	// it, per round: what the observer costs beyond the profile's own
	// gRPC traffic.
	NullObserver    *Result
	ObserverNullObs []float64
	// RoundRatios is fusebox's CPU per request over the null server's, per
	// round: the machine is shared and noisy, so the median of paired
	// rounds is the figure to quote.
	RoundRatios []float64
}

// MedianRatio is the median of the per-round CPU ratios.
func (rep *Report) MedianRatio() float64 { return median(rep.RoundRatios) }

func median(rs []float64) float64 {
	r := slices.Clone(rs)
	slices.Sort(r)
	if len(r) == 0 {
		return 0
	}
	return r[len(r)/2]
}

// Print writes the report.
func (rep *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "%-10s %9s %14s %12s %12s %12s\n", "server", "requests", "cpu/request", "msg p50", "msg p99", "reads/writes")
	for _, r := range []*Result{rep.Null, rep.NullTuned, rep.Fusebox, rep.Observer, rep.NullObserver} {
		if r == nil {
			continue
		}
		rd, wr := r.SyscallsPerRequest()
		fmt.Fprintf(w, "%-10s %9d %14v %12v %12v %5.1f/%-5.1f\n", r.Name, r.Requests, r.CPUPerRequest().Round(100*time.Nanosecond), r.Pct(0.5).Round(time.Microsecond), r.Pct(0.99).Round(time.Microsecond), rd, wr)
	}
	if o := rep.Observer; o != nil {
		fmt.Fprintf(w, "observer/null: cpu %.2fx (median of %d paired rounds; all rounds pooled %.2fx); the observer's latencies are its 2 request-path round trips, no response message is waited for\n",
			median(rep.ObserverRatios), len(rep.ObserverRatios), float64(o.CPUPerRequest())/float64(rep.Null.CPUPerRequest()))
	}
	fmt.Fprintf(w, "fusebox/null: cpu %.2fx (median of %d paired rounds; all rounds pooled %.2fx), p50 %.2fx, p99 %.2fx\n",
		rep.MedianRatio(), len(rep.RoundRatios),
		float64(rep.Fusebox.CPUPerRequest())/float64(rep.Null.CPUPerRequest()),
		float64(rep.Fusebox.Pct(0.5))/float64(rep.Null.Pct(0.5)),
		float64(rep.Fusebox.Pct(0.99))/float64(rep.Null.Pct(0.99)))
	if no := rep.NullObserver; no != nil && rep.Observer != nil && len(rep.ObserverNullObs) > 0 {
		fmt.Fprintf(w, "observer/null-obs (the null server playing the observer profile): cpu %.2fx (median of %d paired rounds; pooled %.2fx); null-obs/null %.2fx (pooled)\n",
			median(rep.ObserverNullObs), len(rep.ObserverNullObs), float64(rep.Observer.CPUPerRequest())/float64(no.CPUPerRequest()),
			float64(no.CPUPerRequest())/float64(rep.Null.CPUPerRequest()))
	}
	if t := rep.NullTuned; t != nil && rep.Observer != nil {
		fmt.Fprintf(w, "over null-wire (the null server on fusebox's own transport): observer %.2fx (pooled %.2fx), fusebox %.2fx (pooled %.2fx); null-wire/null %.2fx (pooled)\n",
			median(rep.ObserverTuned), float64(rep.Observer.CPUPerRequest())/float64(t.CPUPerRequest()),
			median(rep.TunedRatios), float64(rep.Fusebox.CPUPerRequest())/float64(t.CPUPerRequest()),
			float64(t.CPUPerRequest())/float64(rep.Null.CPUPerRequest()))
	}
}

// Run starts both servers and measures them in alternating rounds.
// The modes of a run (flags).
var (
	waitChunks, withAccessLog bool
	fuseboxEnv                []string
	// chunkGap paces the observer profile's chunks (-chunk-gap).
	chunkGap time.Duration
)

func Run(fuseboxBin, nullBin string, requests, rounds, conc int) (*Report, error) {
	fb, err := startFusebox(fuseboxBin)
	if err != nil {
		return nil, err
	}
	defer fb.stop()
	if withAccessLog {
		// The shipped configs keep one access log stream per Envoy worker
		// open to fusebox; healthy requests send it nothing (its filter).
		s, err := accesslogv3.NewAccessLogServiceClient(fb.conn).StreamAccessLogs(context.Background())
		if err != nil {
			return nil, err
		}
		if err := s.Send(&accesslogv3.StreamAccessLogsMessage{Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{LogName: "fusebox"}}); err != nil {
			return nil, err
		}
	}
	nl, err := startNull(nullBin)
	if err != nil {
		return nil, err
	}
	defer nl.stop()
	nt, err := startNull(nullBin, "-wire")
	if err != nil {
		return nil, err
	}
	defer nt.stop()
	ob, err := startFuseboxObserver(fuseboxBin)
	if err != nil {
		return nil, err
	}
	defer ob.stop()
	no, err := startNull(nullBin, "-observer")
	if err != nil {
		return nil, err
	}
	defer no.stop()
	rep := &Report{Null: &Result{Name: "null"}, Fusebox: &Result{Name: "fusebox"}, Observer: &Result{Name: "observer"}, NullTuned: &Result{Name: "null-wire"},
		NullObserver: &Result{Name: "null-obs"}}
	l := newLifecycle()
	ob.observer, no.observer = true, true
	for _, s := range []*proc{nl, fb, ob, nt, no} { // warm up
		if _, err := s.drive(l, 200, conc, nil); err != nil {
			return nil, err
		}
	}
	for i := 0; i < rounds; i++ {
		var cpu [5]time.Duration
		for j, p := range []struct {
			s *proc
			r *Result
		}{{nl, rep.Null}, {fb, rep.Fusebox}, {ob, rep.Observer}, {nt, rep.NullTuned}, {no, rep.NullObserver}} {
			c0, err := procCPU(p.s.cmd.Process.Pid)
			if err != nil {
				return nil, err
			}
			r0, w0 := procSyscalls(p.s.cmd.Process.Pid)
			t0 := time.Now()
			lat, err := p.s.drive(l, requests, conc, p.r)
			if err != nil {
				return nil, err
			}
			c1, _ := procCPU(p.s.cmd.Process.Pid)
			r1, w1 := procSyscalls(p.s.cmd.Process.Pid)
			p.r.Reads += r1 - r0
			p.r.Writes += w1 - w0
			p.r.CPU += c1 - c0
			cpu[j] = c1 - c0
			p.r.WallClock += time.Since(t0)
			p.r.Requests += requests
			p.r.Latencies = append(p.r.Latencies, lat...)
		}
		if cpu[0] > 0 {
			rep.RoundRatios = append(rep.RoundRatios, float64(cpu[1])/float64(cpu[0]))
			rep.ObserverRatios = append(rep.ObserverRatios, float64(cpu[2])/float64(cpu[0]))
		}
		if cpu[4] > 0 {
			rep.ObserverNullObs = append(rep.ObserverNullObs, float64(cpu[2])/float64(cpu[4]))
		}
		if cpu[3] > 0 {
			rep.TunedRatios = append(rep.TunedRatios, float64(cpu[1])/float64(cpu[3]))
			rep.ObserverTuned = append(rep.ObserverTuned, float64(cpu[2])/float64(cpu[3]))
		}
	}
	return rep, nil
}

type proc struct {
	cmd  *exec.Cmd
	conn *grpc.ClientConn
	// admin is fusebox's admin address ("" for the null servers).
	admin string
	// observer: driven as the observer profile (runObserver).
	observer bool
}

func (p *proc) stop() {
	if p.conn != nil {
		p.conn.Close()
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startFusebox runs fusebox with args (a -config, or none: the embedded
// default) on free ports.
func startFusebox(bin string, args ...string) (*proc, error) {
	return startFuseboxOn(bin, tcpListener, args...)
}

// The ext_proc listener a fusebox under test serves on.
const (
	tcpListener  = "tcp"
	unixListener = "uds"
)

// startFuseboxOn is startFusebox with its ext_proc listener on loopback
// TCP or on a Unix socket in a fresh directory.
func startFuseboxOn(bin, listener string, args ...string) (*proc, error) {
	var grpcAddr string
	var err error
	if listener == unixListener {
		dir, derr := os.MkdirTemp("", "wbsock")
		if derr != nil {
			return nil, derr
		}
		grpcAddr = "unix://" + filepath.Join(dir, "extproc.sock")
	} else if grpcAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	adminAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append(args, "-grpc-addr", grpcAddr, "-admin-addr", adminAddr, "-log-level", "warn")...)
	cmd.Env = append(os.Environ(), fuseboxEnv...)
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p, err := connect(cmd, grpcAddr)
	if p != nil {
		p.admin = adminAddr
	}
	return p, err
}

func startNull(bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("nullproc: %v", err)
	}
	return connect(cmd, strings.TrimSpace(strings.TrimPrefix(line, "listening")))
}

func connect(cmd *exec.Cmd, addr string) (*proc, error) {
	p := &proc{cmd: cmd}
	deadline := time.Now().Add(20 * time.Second)
	for {
		network, a := "tcp", addr
		if path, ok := strings.CutPrefix(addr, "unix://"); ok {
			network, a = "unix", path
		}
		c, err := net.DialTimeout(network, a, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not listen on %s", cmd.Path, addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient(addr, envoyDialOptions()...)
	if err != nil {
		p.stop()
		return nil, err
	}
	p.conn = conn
	return p, nil
}

// procCPU is a process's CPU time, every thread included (dead ones too):
// utime+stime from /proc/<pid>/stat, in clock ticks of 10 ms. The rounds
// are long enough for that resolution.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// procSyscalls is a process's read and write system calls so far
// (/proc/<pid>/io; 0 where it cannot be read).
func procSyscalls(pid int) (reads, writes int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
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

// drive runs n lifecycles over conc concurrent streams and returns every
// message's latency.
func (p *proc) drive(l *lifecycle, n, conc int, _ *Result) ([]time.Duration, error) {
	client := extprocv3.NewExternalProcessorClient(p.conn)
	var mu sync.Mutex
	var all []time.Duration
	var firstErr error
	work := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		work <- struct{}{}
	}
	close(work)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 64*n/conc+64)
			for range work {
				var err error
				run := l.run
				if p.observer {
					run = l.runObserver
				}
				if lat, err = run(client, lat); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, firstErr
}

// lifecycle is one request as Envoy sends it with the shipped modes.
type lifecycle struct {
	reqHeaders, reqBody, respHeaders *extprocv3.ProcessingRequest
	chunks                           []*extprocv3.ProcessingRequest
}

func header(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func newLifecycle() *lifecycle {
	var sb strings.Builder
	sb.WriteString(`{"model":"gpt-4o-mini","stream":true,"messages":[`)
	for sb.Len() < 8<<10-64 {
		sb.WriteString(`{"role":"user","content":"Lorem ipsum dolor sit amet, consectetur adipiscing"},`)
	}
	sb.WriteString(`{"role":"user","content":"end"}]}`)
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"response.flags": structpb.NewNumberValue(0), "response.code_details": structpb.NewStringValue("via_upstream")}}}
	l := &lifecycle{
		reqHeaders: &extprocv3.ProcessingRequest{
			ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED},
			MetadataContext: &corev3.Metadata{},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: header(
				":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw.local", ":scheme", "https",
				"content-type", "application/json", "x-request-id", "0f7c", "x-forwarded-proto", "https",
				"x-fusebox-gateway", "default", "user-agent", "wirebench")}},
		},
		reqBody: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(sb.String()), EndOfStream: true}}},
		respHeaders: &extprocv3.ProcessingRequest{
			Request:    &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: header(":status", "200", "content-type", "text/event-stream")}},
			Attributes: attrs,
		},
	}
	for i := 0; i < 50; i++ {
		chunk := fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token %d \"},\"finish_reason\":null}]}\n\n", i)
		if i == 49 {
			chunk = "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
		}
		l.chunks = append(l.chunks, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: i == 49}}})
	}
	return l
}

// envoyStreamContext is a lifecycle's context: cancelled after 30 s (a
// stuck server must not hang the benchmark), but with no deadline, so
// that no grpc-timeout goes out. Envoy sends none on an ext_proc stream
// (docs/envoy.md: Common::prepareHeaders adds it only for a call with a
// timeout, and message_timeout is the filter's own timer); the driver
// sent one before, and each server under test paid a deadline timer per
// stream for it (a twentieth of fusebox's allocations in the observer
// profile).
func envoyStreamContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t := time.AfterFunc(30*time.Second, cancel)
	return ctx, func() { t.Stop(); cancel() }
}

// run drives one lifecycle and appends each message's latency to lat.
func (l *lifecycle) run(client extprocv3.ExternalProcessorClient, lat []time.Duration) ([]time.Duration, error) {
	ctx, cancel := envoyStreamContext()
	defer cancel()
	s, err := client.Process(ctx)
	if err != nil {
		return lat, err
	}
	// inTurn sends each message once the previous one's reply came.
	inTurn := func(ms []*extprocv3.ProcessingRequest) error {
		for _, m := range ms {
			t0 := time.Now()
			if err := s.Send(m); err != nil {
				return err
			}
			if _, err := s.Recv(); err != nil {
				return err
			}
			lat = append(lat, time.Since(t0))
		}
		return nil
	}
	if err := inTurn([]*extprocv3.ProcessingRequest{l.reqHeaders, l.reqBody, l.respHeaders}); err != nil {
		return lat, err
	}
	if waitChunks {
		if err := inTurn(l.chunks); err != nil {
			return lat, err
		}
		_ = s.CloseSend()
		if _, err := s.Recv(); err != io.EOF {
			return lat, fmt.Errorf("want EOF at the end of the stream, got %v", err)
		}
		return lat, nil
	}
	// Envoy does not wait for each chunk's reply: the chunks are pipelined
	// and each reply is timed from its own chunk's send.
	sent := make([]time.Time, len(l.chunks))
	errc := make(chan error, 1)
	go func() {
		for i, m := range l.chunks {
			sent[i] = time.Now()
			if err := s.Send(m); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got := make([]time.Time, 0, len(l.chunks))
	for range l.chunks {
		if _, err := s.Recv(); err != nil {
			return lat, err
		}
		got = append(got, time.Now())
	}
	if err := <-errc; err != nil {
		return lat, err
	}
	for i := range got {
		lat = append(lat, got[i].Sub(sent[i]))
	}
	_ = s.CloseSend()
	if _, err := s.Recv(); err != io.EOF {
		return lat, fmt.Errorf("want EOF at the end of the stream, got %v", err)
	}
	return lat, nil
}

// envoyWindow and envoyConnWindow are the HTTP/2 windows the driver
// advertises, for each stream and for the connection: Envoy's defaults for
// a cluster from 1.36 (16 MiB and 24 MiB, the 1.36.0 release notes;
// docs/envoy.md). Any window above a lifecycle's replies is the same to
// the servers under test.
const (
	envoyWindow     = 16 << 20
	envoyConnWindow = 24 << 20
)

// envoyDialOptions are the driver's connection options: h2c, with the
// static windows of Envoy's HTTP/2 codec. Envoy sends a PING on a cluster's
// connection only for http2_protocol_options.connection_keepalive, which
// the shipped configs do not set; a grpc-go client by default pings once
// per round trip while data flows, to size its window (BDP estimation),
// and every server under test paid a ping's read and its ack's write for
// it. A window set here turns that estimation off.
func envoyDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(envoyWindow), grpc.WithInitialConnWindowSize(envoyConnWindow)}
}
