package mainlib

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCorruptPersistPathStillStarts: an unparsable store.memory.persist_path
// is moved aside, logged and counted, and fusebox starts on its config
// file; temporary files of an interrupted write are removed. Before, the
// file stopped fusebox from starting.
func TestCorruptPersistPathStillStarts(t *testing.T) {
	dir := t.TempDir()
	persist := filepath.Join(dir, "overlays.json")
	if err := os.WriteFile(persist, []byte(`{"version":1,"gateways":{"default":`), 0o600); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(dir, ".overlays.json.4242")
	if err := os.WriteFile(left, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	in := startEdited(t, func(doc string) string {
		return strings.Replace(doc, "store:\n  backend: memory\n", "store:\n  backend: memory\n  memory: {persist_path: "+persist+"}\n", 1)
	}, &logs)
	if _, m := get(t, "http://"+in.AdminAddr()+"/metrics", ""); !strings.Contains(m, `fusebox_refused_total{what="persist_corrupt"} 1`) {
		t.Fatal("the moved-aside persist file was not counted")
	}
	if !strings.Contains(logs.String(), "moved aside") {
		t.Fatalf("not logged:\n%s", logs.String())
	}
	aside, _ := filepath.Glob(persist + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("moved-aside files: %v", aside)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatal("the temporary file of an interrupted write is still there")
	}
}
