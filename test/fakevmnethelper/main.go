// Command fakevmnethelper behaves like vmnet-helper (github.com/nirs/vmnet-helper)
// for tests on machines without vmnet: it takes the same flags, checks them
// as strictly as vmnet-helper does (an unknown flag or a bad combination is
// an ERROR line and exit 1), prints the JSON line vmnet-helper prints, with
// its keys in a random order, creates the --socket (unixgram, mode 0600) or
// checks the --fd, logs `INFO  [stats] {...}` lines with growing counters
// every --stats-interval, and exits 0 on SIGTERM or SIGINT.
//
// The environment steers it:
//
//	FAKE_VMNET_HELPER_MODE   shared, host or network: the JSON shape to print
//	                         (default: --network gives network, else the
//	                         --operation-mode; bridged prints the host shape);
//	                         fail: no JSON, an ERROR line, exit 1;
//	                         hang: never prints the JSON line;
//	                         ignore-term: like the default but ignores SIGTERM.
//	FAKE_VMNET_HELPER_ARGV   a file to write the argv to (a JSON array,
//	                         argv[0] included), before anything else.
//	FAKE_VMNET_HELPER_TICK   a Go duration that replaces --stats-interval's
//	                         period (so tests need not wait whole seconds).
//	SUDO_UID, SUDO_GID       as for vmnet-helper, the ids it runs as after
//	                         starting the interface: logged, and when the
//	                         fake is root, the owner of its socket.
//	FAKE_VMNET_HELPER_SOCKET_DELAY  a Go duration to wait between the JSON
//	                         line and creating the socket (default 50ms),
//	                         as vmnet-helper binds it only after dropping
//	                         privileges.
package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

type options struct {
	fd                                   int
	socket                               string
	interfaceID                          string
	operationMode                        string
	sharedInterface                      string
	startAddress, endAddress, subnetMask string
	network                              string
	tso, checksumOffload, isolation      bool
	statsInterval                        string
	verbose                              bool
	version, listShared                  bool
}

func logf(w io.Writer, level, format string, args ...any) {
	fmt.Fprintf(w, "%-5s [main] %s\n", level, fmt.Sprintf(format, args...))
}

func parse(args []string) (*options, error) {
	o := &options{fd: -1}
	fs := flag.NewFlagSet("vmnet-helper", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&o.fd, "fd", -1, "")
	fs.StringVar(&o.socket, "socket", "", "")
	fs.StringVar(&o.interfaceID, "interface-id", "", "")
	fs.StringVar(&o.operationMode, "operation-mode", "", "")
	fs.StringVar(&o.sharedInterface, "shared-interface", "", "")
	fs.StringVar(&o.startAddress, "start-address", "", "")
	fs.StringVar(&o.endAddress, "end-address", "", "")
	fs.StringVar(&o.subnetMask, "subnet-mask", "", "")
	fs.StringVar(&o.network, "network", "", "")
	fs.BoolVar(&o.tso, "enable-tso", false, "")
	fs.BoolVar(&o.checksumOffload, "enable-checksum-offload", false, "")
	fs.BoolVar(&o.isolation, "enable-isolation", false, "")
	fs.StringVar(&o.statsInterval, "stats-interval", "", "")
	fs.BoolVar(&o.verbose, "v", false, "")
	fs.BoolVar(&o.verbose, "verbose", false, "")
	fs.BoolVar(&o.version, "version", false, "")
	fs.BoolVar(&o.listShared, "list-shared-interfaces", false, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.version || o.listShared {
		return o, nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case set["fd"] && set["socket"]:
		return nil, errors.New(`Conflicting arguments: "fd" and "socket" are mutually exclusive`)
	case !set["fd"] && !set["socket"]:
		return nil, errors.New(`Missing argument: either "fd" or "socket" required`)
	case set["fd"] && o.fd < 0:
		return nil, fmt.Errorf("Invalid fd '%d'", o.fd)
	}
	if set["interface-id"] && !api.ValidInterfaceID(o.interfaceID) {
		return nil, fmt.Errorf("Invalid interface-id: %q", o.interfaceID)
	}
	addrs := 0
	for _, name := range []string{"start-address", "end-address", "subnet-mask"} {
		if set[name] {
			addrs++
			v := map[string]string{"start-address": o.startAddress, "end-address": o.endAddress, "subnet-mask": o.subnetMask}[name]
			if a, err := netip.ParseAddr(v); err != nil || !a.Is4() {
				return nil, fmt.Errorf("Invalid --%s: %q", name, v)
			}
		}
	}
	if addrs != 0 && addrs != 3 {
		return nil, errors.New("--start-address, --end-address and --subnet-mask must be specified together")
	}
	if set["network"] {
		for _, name := range []string{"operation-mode", "shared-interface", "start-address", "end-address", "subnet-mask"} {
			if set[name] {
				return nil, fmt.Errorf("Conflicting arguments: network and %s are mutually exclusive", name)
			}
		}
		if o.network == "" {
			return nil, errors.New("Invalid network: empty name")
		}
	}
	switch o.operationMode {
	case "":
		if !set["network"] {
			o.operationMode = "shared"
		}
	case "shared", "host", "bridged":
	default:
		return nil, fmt.Errorf("Invalid --operation-mode: %q", o.operationMode)
	}
	if o.operationMode == "bridged" && o.sharedInterface == "" {
		return nil, errors.New("Missing argument: shared-interface is required for operation-mode=bridged")
	}
	if o.operationMode == "bridged" && addrs > 0 {
		return nil, errors.New("Conflicting arguments: address options are not used with operation-mode=bridged")
	}
	if o.isolation && o.operationMode != "host" {
		return nil, errors.New("Conflicting arguments: enable-isolation requires operation-mode=host")
	}
	if set["stats-interval"] {
		if n, err := strconv.Atoi(o.statsInterval); err != nil || n <= 0 {
			return nil, fmt.Errorf("Invalid stats-interval: %q", o.statsInterval)
		}
	}
	return o, nil
}

func run(argv []string, stdout, stderr io.Writer) int {
	if path := os.Getenv("FAKE_VMNET_HELPER_ARGV"); path != "" {
		b, _ := json.Marshal(argv)
		if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
			logf(stderr, "ERROR", "writing FAKE_VMNET_HELPER_ARGV: %v", err)
			return 1
		}
	}
	o, err := parse(argv[1:])
	if err != nil {
		logf(stderr, "ERROR", "%v", err)
		return 1
	}
	if o.version {
		fmt.Fprintf(stdout, "version: v0.13.0-fake\ncommit: 0000000000000000000000000000000000000000\n")
		return 0
	}
	if o.listShared {
		fmt.Fprintf(stdout, "en0\nen1\n")
		return 0
	}

	mode := os.Getenv("FAKE_VMNET_HELPER_MODE")
	ignoreTerm := mode == "ignore-term"
	if mode == "" || ignoreTerm {
		switch {
		case o.network != "":
			mode = "network"
		case o.operationMode == "shared":
			mode = "shared"
		default:
			mode = "host"
		}
	}

	term := make(chan os.Signal, 1)
	if ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
		signal.Notify(term, syscall.SIGINT)
	} else {
		signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	}

	logf(stderr, "INFO ", "running %s v0.13.0-fake on fakeOS", argv[0])
	if o.verbose {
		logf(stderr, "DEBUG", "mode %s", mode)
	}
	switch mode {
	case "fail":
		logf(stderr, "ERROR", "Failed to start interface: VMNET_FAILURE (1001)")
		return 1
	case "hang":
		logf(stderr, "INFO ", "starting vmnet interface")
		<-term
		return 0
	case "shared", "host", "network":
	default:
		logf(stderr, "ERROR", "unknown FAKE_VMNET_HELPER_MODE %q", mode)
		return 1
	}

	var conn *net.UnixConn
	if o.fd >= 0 {
		f := os.NewFile(uintptr(o.fd), "fd")
		fc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			logf(stderr, "ERROR", "Invalid fd %d: %v", o.fd, err)
			return 1
		}
		uc, ok := fc.(*net.UnixConn)
		if !ok {
			logf(stderr, "ERROR", "fd %d is not a unix socket", o.fd)
			return 1
		}
		conn = uc
	}

	fmt.Fprintln(stdout, readyLine(o, mode))
	logf(stderr, "INFO ", "started vmnet interface")
	if uid, gid, ok := sudoIDs(); ok {
		logf(stderr, "INFO ", "running as uid: %d gid: %d", uid, gid)
	} else {
		logf(stderr, "INFO ", "running as uid: %d gid: %d", os.Getuid(), os.Getgid())
	}

	if o.socket != "" {
		delay := 50 * time.Millisecond
		if d, err := time.ParseDuration(os.Getenv("FAKE_VMNET_HELPER_SOCKET_DELAY")); err == nil {
			delay = d
		}
		time.Sleep(delay)
		lock, err := os.OpenFile(o.socket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			logf(stderr, "ERROR", "Failed to create lock %q: %v", o.socket+".lock", err)
			return 1
		}
		defer lock.Close()
		defer os.Remove(o.socket + ".lock")
		os.Remove(o.socket)
		// Bound under a umask that makes it 0600 from the start: whoever
		// waits for the path must never see it with wider permissions.
		oldMask := syscall.Umask(0o177)
		uc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: o.socket, Net: "unixgram"})
		syscall.Umask(oldMask)
		if err != nil {
			logf(stderr, "ERROR", "Failed to bind %q: %v", o.socket, err)
			return 1
		}
		defer os.Remove(o.socket)
		if err := os.Chmod(o.socket, 0o600); err != nil {
			logf(stderr, "ERROR", "Failed to chmod %q: %v", o.socket, err)
			return 1
		}
		// vmnet-helper binds the socket after dropping privileges to
		// $SUDO_UID/$SUDO_GID, so the socket is the user's; the fake, when
		// root, gives it to them instead of dropping.
		if uid, gid, ok := sudoIDs(); ok && os.Geteuid() == 0 {
			for _, p := range []string{o.socket, o.socket + ".lock"} {
				if err := os.Lchown(p, uid, gid); err != nil {
					logf(stderr, "ERROR", "Failed to chown %q: %v", p, err)
					return 1
				}
			}
		}
		conn = uc
		logf(stderr, "INFO ", "waiting for client on %q", o.socket)
	}
	defer conn.Close()

	var tick <-chan time.Time
	if o.statsInterval != "" {
		n, _ := strconv.Atoi(o.statsInterval)
		period := time.Duration(n) * time.Second
		if d, err := time.ParseDuration(os.Getenv("FAKE_VMNET_HELPER_TICK")); err == nil && d > 0 {
			period = d
		}
		t := time.NewTicker(period)
		defer t.Stop()
		tick = t.C
	}
	var st stats
	for {
		select {
		case <-tick:
			st.grow()
			fmt.Fprintln(stderr, st.line())
		case sig := <-term:
			logf(stderr, "INFO ", "received signal %s", sig)
			fmt.Fprintln(stderr, st.line())
			logf(stderr, "INFO ", "helper terminated")
			return 0
		}
	}
}

// sudoIDs are $SUDO_UID and $SUDO_GID, which vmnet-helper drops to.
func sudoIDs() (uid, gid int, ok bool) {
	u, err1 := strconv.Atoi(os.Getenv("SUDO_UID"))
	g, err2 := strconv.Atoi(os.Getenv("SUDO_GID"))
	return u, g, err1 == nil && err2 == nil && u >= 0 && g >= 0
}

type counters struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	Drops   uint64 `json:"drops"`
	Fast    uint64 `json:"fast"`
	Slow    uint64 `json:"slow"`
}

type stats struct{ host, vm counters }

func (s *stats) grow() {
	s.host.Packets += 10
	s.host.Bytes += 10 * 1514
	s.host.Fast += 1
	s.host.Slow += 2
	s.vm.Packets += 4
	s.vm.Bytes += 4 * 98
	s.vm.Slow += 4
}

func (s *stats) line() string {
	b, _ := json.Marshal(struct {
		Time string   `json:"time"`
		Host counters `json:"host"`
		VM   counters `json:"vm"`
	}{time.Now().UTC().Format(time.RFC3339Nano), s.host, s.vm})
	return "INFO  [stats] " + string(b)
}

// readyLine is vmnet-helper's JSON line for o, keys in a random order as
// vmnet-helper's (a dictionary) are.
func readyLine(o *options, mode string) string {
	id := strings.ToUpper(o.interfaceID)
	if id == "" {
		id = randomUUID()
	}
	start, end, mask := o.startAddress, o.endAddress, o.subnetMask
	if start == "" {
		start, end, mask = "192.168.105.1", "192.168.105.254", "255.255.255.0"
		if o.operationMode == "host" {
			start, end = "192.168.106.1", "192.168.106.254"
		}
	}
	maxPacket := 1514
	if o.tso {
		maxPacket = 65550
	}
	kv := [][2]string{
		{"vmnet_mac_address", q(mac(id))},
		{"vmnet_mtu", "1500"},
		{"vmnet_max_packet_size", strconv.Itoa(maxPacket)},
		{"vmnet_interface_id", q(id)},
		{"vmnet_read_max_packets", "256"},
		{"vmnet_write_max_packets", "256"},
	}
	if o.operationMode != "bridged" {
		kv = append(kv,
			[2]string{"vmnet_start_address", q(start)},
			[2]string{"vmnet_end_address", q(end)},
			[2]string{"vmnet_subnet_mask", q(mask)})
	}
	if mode == "shared" || mode == "network" {
		kv = append(kv, [2]string{"vmnet_nat66_prefix", q("fd9b:5a14:ba57:e3d3::")})
	}
	if mode == "network" {
		kv = append(kv,
			[2]string{"net_ipv4_subnet", q("192.168.105.0")},
			[2]string{"net_ipv4_mask", q("255.255.255.0")},
			[2]string{"net_ipv6_prefix", q("fd9b:5a14:ba57:e3d3::")},
			[2]string{"net_ipv6_prefix_len", "64"})
	}
	mrand.Shuffle(len(kv), func(i, j int) { kv[i], kv[j] = kv[j], kv[i] })
	parts := make([]string, len(kv))
	for i, p := range kv {
		parts[i] = q(p[0]) + ": " + p[1]
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// mac is what vmnet does for an interface id: the same id, the same MAC.
func mac(id string) string {
	sum := sha256.Sum256([]byte("fake-vmnet/" + id))
	sum[0] = sum[0]&^0x01 | 0x02
	return net.HardwareAddr(sum[:6]).String()
}

func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%X-%X-%X-%X-%X", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
