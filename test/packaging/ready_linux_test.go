package packaging

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmnetctl/vmnetctl/ops"
	"github.com/vmnetctl/vmnetctl/statedir"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// The unit is Type=notify: `systemctl start` returns when `vmnetctl serve`
// sends READY=1 to $NOTIFY_SOCKET, which it must do only once its API
// answers. Here a unixgram socket of the test's own plays systemd's; serve
// runs in a network namespace of the test's own with a state dir of its
// own, and the API is asked once, at once, when READY=1 arrives.
func TestServeNotifiesReady(t *testing.T) {
	testutil.RequireRoot(t, "serve runs as root, in a network namespace")
	testutil.RequireCommands(t, "ip")
	tmp := t.TempDir()
	bin, err := testutil.BuildVmnetctl(tmp)
	if err != nil {
		t.Fatal(err)
	}
	notify := filepath.Join(tmp, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sd := statedir.Dir{Path: filepath.Join(tmp, "state")}

	ns := testutil.NewNS(t, "ready")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := ns.Command(ctx, bin, "serve", "--state-dir", sd.Path, "--metrics-addr", "off")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify)
	logFile, err := os.Create(filepath.Join(tmp, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	log := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { cancel(); <-done }()

	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no READY=1 on NOTIFY_SOCKET: %v\nserve's output:\n%s", err, log())
		}
		if strings.Contains("\n"+string(buf[:n])+"\n", "\nREADY=1\n") {
			break
		}
	}
	if !ops.NewClient(sd).Running(context.Background()) {
		t.Fatalf("READY=1 came before the API at %s answered\nserve's output:\n%s", sd.APISocket(), log())
	}
}
