// Command nullproc is the baseline of make bench-wire: an ext_proc server
// that answers every message with the CONTINUE reply of its kind and does
// nothing else, on grpc-go's server (with -wire, on fusebox's own transport,
// pkg/grpcwire; with -observer, the observer profile's replies
// only).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/grpcwire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

type server struct {
	extprocv3.UnimplementedExternalProcessorServer
	// observer plays the observer profile (envoy-observer.yaml) the way
	// fusebox does and does nothing else: the request phases get their
	// CONTINUE with a fixed fusebox.observe note (the driver checks that
	// it came), observed messages get no reply, and the stream ends at
	// the response's last chunk.
	observer bool
}

// observeNote is the null observer's fixed note.
var observeNote = &structpb.Struct{Fields: map[string]*structpb.Value{
	"fusebox.observe": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"n": structpb.NewStringValue("null")}}),
}}

func (srv server) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if srv.observer && req.ObservabilityMode {
			if req.GetResponseBody().GetEndOfStream() {
				return nil
			}
			continue
		}
		var resp *extprocv3.ProcessingResponse
		switch req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_RequestBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		}
		if srv.observer {
			resp.DynamicMetadata = observeNote
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

func main() {
	addr := flag.String("grpc-addr", "127.0.0.1:0", "listen address")
	wire := flag.Bool("wire", false, "serve on fusebox's own gRPC transport (pkg/grpcwire) instead of grpc-go's server")
	observer := flag.Bool("observer", false, "play the observer profile: no reply to observed messages, the stream ended at the response's last chunk")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file until SIGINT")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go func() {
			ch := make(chan os.Signal, 1)
			signal.Notify(ch, os.Interrupt)
			<-ch
			pprof.StopCPUProfile()
			f.Close()
			os.Exit(0)
		}()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening", ln.Addr())
	var gs interface {
		grpc.ServiceRegistrar
		Serve(net.Listener) error
	}
	if *wire {
		gs = grpcwire.NewServer(grpcwire.Options{Codec: encoding.GetCodecV2("proto")})
	} else {
		gs = grpc.NewServer()
	}
	extprocv3.RegisterExternalProcessorServer(gs, server{observer: *observer})
	if err := gs.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
