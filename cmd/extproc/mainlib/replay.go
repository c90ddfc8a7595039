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
	"google.golang.org/grpc"

	"github.com/fusebox-llm/fusebox/pkg/replay"
	"github.com/fusebox-llm/fusebox/pkg/routes"
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
	rt, err := routes.LoadFile(*cand)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	// The files are read as they replay (replay.Files: memory does not
	// grow with the log), once per config.
	src := &replay.Files{Paths: fs.Args()}
	cr, err := replay.RunErr(rt, src)
	if err != nil {
		return err
	}
	if src.Lines == 0 {
		// Nothing to replay is not a report with nothing in it: before, a
		// file of pure junk exited 0.
		for _, ex := range src.Examples {
			fmt.Fprintln(stderr, "malformed:", ex)
		}
		return &ExitError{Code: 2, Err: fmt.Errorf("no access log line in %s (%d malformed)", strings.Join(fs.Args(), ", "), src.Malformed)}
	}
	if cr.Skipped == cr.Lines {
		// Every line names a gateway or model the config lacks: an empty
		// table that exited 0 said nothing was wrong (#54).
		return &ExitError{Code: 2, Err: fmt.Errorf("-config %s matches none of the %d lines: every one names a gateway or model it lacks (the lines' gateway comes from x-fusebox-gateway or fusebox's metadata, else \"default\"; their model from fusebox's metadata)", *cand, cr.Lines)}
	}
	from, to := float64(src.First)/1e9, float64(src.Last)/1e9
	if src.OutOfOrder > 0 {
		fmt.Fprintf(stderr, "replay: %d lines came later than the reorder window holds; each was replayed at the time of the line before it\n", src.OutOfOrder)
	}
	res := &replay.Result{Candidate: cr}
	if *base != "" {
		brt, err := routes.LoadFile(*base)
		if err != nil {
			return fmt.Errorf("-baseline: %w", err)
		}
		if res.Baseline, err = replay.RunErr(brt, src); err != nil {
			return err
		}
	}
	switch {
	case *asJSON:
		return res.WriteJSON(stdout)
	case *asHTML:
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
