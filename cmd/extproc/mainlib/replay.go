package mainlib

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/fusebox-llm/fusebox/pkg/replay"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"google.golang.org/grpc"
)

// replayCmd is `extproc replay -config CANDIDATE.yaml [-baseline LIVE.yaml]
// [-json|-html] LOG...` (SPEC §13).
func replayCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("extproc replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cand := fs.String("config", "", "the candidate config to replay the logs under (required)")
	base := fs.String("baseline", "", "a config to compare with (the live one); without it the report stands alone")
	asJSON := fs.Bool("json", false, "write the report as JSON")
	asHTML := fs.Bool("html", false, "write one self-contained HTML page with a timeline per route")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cand == "" || fs.NArg() == 0 {
		return errors.New("usage: extproc replay -config CANDIDATE.yaml [-baseline LIVE.yaml] [-json|-html] LOG files")
	}
	log, err := replay.ReadFiles(fs.Args()...)
	if err != nil {
		return err
	}
	if len(log.Lines) == 0 {
		// Nothing to replay is not a report with nothing in it: before, a
		// file of pure junk exited 0.
		for _, ex := range log.Examples {
			fmt.Fprintln(stderr, "malformed:", ex)
		}
		return &ExitError{Code: 2, Err: fmt.Errorf("no access log line in %s (%d malformed)", strings.Join(fs.Args(), ", "), log.Malformed)}
	}
	rt, err := routes.LoadFile(*cand)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	res := &replay.Result{Candidate: replay.Run(rt, log)}
	if *base != "" {
		brt, err := routes.LoadFile(*base)
		if err != nil {
			return fmt.Errorf("-baseline: %w", err)
		}
		res.Baseline = replay.Run(brt, log)
	}
	switch {
	case *asJSON:
		return res.WriteJSON(stdout)
	case *asHTML:
		var from, to float64
		if n := len(log.Lines); n > 0 {
			from, to = float64(log.Lines[0].At)/1e9, float64(log.Lines[n-1].At)/1e9
		}
		return res.WriteHTML(stdout, from, to)
	}
	res.WriteText(stdout)
	return nil
}

// recordLogCmd is `extproc record-log -listen ADDR -out FILE`: Envoy's
// access log channel written as replayable JSON lines, until SIGTERM.
func recordLogCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("extproc record-log", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:50052", "address of the gRPC access log service Envoy's http_grpc logger points at")
	out := fs.String("out", "", "file to append the lines to (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("usage: extproc record-log -listen ADDR -out FILE")
	}
	f, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	rec := replay.NewRecorder(f)
	srv := grpc.NewServer()
	accesslogv3.RegisterAccessLogServiceServer(srv, rec)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	fmt.Fprintf(stderr, "recording Envoy's access log entries on %s into %s\n", ln.Addr(), *out)
	err = srv.Serve(ln)
	if ferr := rec.Flush(); err == nil {
		err = ferr
	}
	fmt.Fprintf(stdout, "%d lines recorded\n", rec.Lines)
	return err
}
