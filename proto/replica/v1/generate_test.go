package replicav1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates replica.pb.go the way `make proto`
// does (Debian's protoc and the protoc-gen-go of go.mod's protobuf module)
// and fails when the committed file differs: a schema change must come with
// its code.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("protoc is missing (Debian: protobuf-compiler); CI installs it")
		}
		t.Skip("protoc is missing (Debian: protobuf-compiler)")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "protoc-gen-go"), "google.golang.org/protobuf/cmd/protoc-gen-go")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building protoc-gen-go: %v\n%s", err, out)
	}
	out := t.TempDir()
	gen := exec.Command(protoc, "--plugin=protoc-gen-go="+filepath.Join(bin, "protoc-gen-go"),
		"--proto_path=../..", "--go_out="+out, "--go_opt=paths=source_relative", "replica/v1/replica.proto")
	if msg, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	want, err := os.ReadFile(filepath.Join(out, "replica", "v1", "replica.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("replica.pb.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, have) {
		t.Fatal("proto/replica/v1/replica.pb.go is stale: run `make proto` and commit the result")
	}
}
