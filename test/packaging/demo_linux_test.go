package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// `sudo make demo` on a host without nftables and without a package
// manager it knows (apt-get, dnf) stops before the demo with the one-line
// fix, instead of one nftables failure per network. PATH is the test's:
// every command of the real PATH but nft, apt-get and dnf (so nothing is
// installed), and without go when Go is in /usr/local/go, as under sudo's
// secure_path: the Makefile finds it there itself.
func TestMakeDemoWithoutNft(t *testing.T) {
	testutil.RequireRoot(t, "make demo's nftables preflight runs as root only")
	testutil.RequireCommands(t, "make")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	hidden := map[string]bool{"nft": true, "apt-get": true, "dnf": true}
	if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
		hidden["go"] = true
	}
	bin := t.TempDir()
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !hidden[e.Name()] {
				os.Symlink(filepath.Join(dir, e.Name()), filepath.Join(bin, e.Name())) // the first of a name wins
			}
		}
	}
	cmd := exec.Command("make", "-C", root, "demo")
	cmd.Env = append(os.Environ(), "PATH="+bin)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make demo without nft succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "vmnetctl needs the nft command: install nftables with your package manager\n") {
		t.Errorf("make demo without nft: want the one-line fix:\n%s", out)
	}
	if strings.Contains(string(out), "vmnetctl networks") || strings.Contains(string(out), "vmnetctl up") {
		t.Errorf("make demo went on without nft:\n%s", out)
	}
}
