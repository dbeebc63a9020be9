//go:build unix

// Command fakevmnethelper behaves like vmnet-helper (github.com/nirs/vmnet-helper)
// for tests on machines without vmnet. Each rule below follows vmnet-helper's
// source as stored in the code index: programs/options.c (commit 3236ee5f,
// the version with --stats-interval and --network-id) for the command line,
// programs/helper.c (commit 0c5a3874) for what it does once started, and
// programs/log.h for the log format ("LEVEL " then the message; option
// errors carry no [component]). Where the fake has to stand in for vmnet
// itself it says so.
//
// What it does, in vmnet-helper's order (helper.c main):
//
//   - parses the options as getopt_long does (long options, unambiguous
//     prefixes, --opt=value, -f/-s/-i/-v/-h; arguments that are not options
//     are ignored), with vmnet-helper's checks and messages (parseOptions);
//   - logs "running PROG VERSION on macOS ...", "running as uid: U gid: G"
//     (the effective ids, before dropping) and "using bulk_forwarding: false"
//     (Linux has no sendmsg_x/recvmsg_x, so it counts as vmnet-helper's slow
//     path does: one read or write per frame, counted in "slow");
//   - "starts the interface": prints the JSON line (through helperproto.Ready,
//     keys in a random order as vmnet's xpc dictionary gives them, compact as
//     write_interface_info prints them) and "started vmnet interface";
//   - drops privileges when root: setgid($SUDO_GID), setuid($SUDO_UID),
//     "dropped privileges to uid: U gid: G" (drop_privileges);
//   - with --socket: takes PATH.lock (flock, as O_EXLOCK), binds PATH
//     (unixgram, 0600), "waiting for client on PATH", learns the client from
//     its first datagram and connects to it, drops that datagram if it is
//     shorter than 64 bytes (vfkit's "VFKT"), "serving client PATH"; with
//     --fd it uses the fd as it is (setup_socket, connect_socket);
//   - forwards: every frame the client sends is read (counted in "vm"),
//     handed to the fake vmnet, which mirrors it back; every frame written
//     to the client is counted in "host". Nothing else is sent or counted;
//   - with --stats-interval only, and only from here on (after the client),
//     logs `INFO  [stats] {...}` every interval (start_stats_timer,
//     report_stats) through helperproto.FormatStatsLine;
//   - SIGTERM or SIGINT: "received signal Terminated", exit 0; a zero-length
//     datagram: "socket was closed by peer", exit 0; a read error: exit 1.
//     On exit it removes the socket and the lock and logs "stopped vmnet
//     interface" (its atexit handlers, in their order).
//
// The environment steers the parts that stand in for vmnet and the test:
//
//	FAKE_VMNET_HELPER_MODE   "" (default): start as the flags say;
//	                         fail: vmnet refuses to start the interface (an
//	                         ERROR line, no JSON, exit 1);
//	                         hang: vmnet never answers (no JSON line);
//	                         ignore-term: like the default, but SIGTERM is
//	                         ignored (SIGINT still stops it).
//	FAKE_VMNET_HELPER_ARGV   a file to write the argv to (a JSON array,
//	                         argv[0] included), before anything else.
//	FAKE_VMNET_HELPER_TICK   a Go duration that replaces --stats-interval's
//	                         period (so tests need not wait whole seconds);
//	                         it never turns stats on by itself.
//	FAKE_VMNET_HELPER_SOCKET_DELAY  a Go duration to wait between the JSON
//	                         line and binding the socket (default 50ms), as
//	                         vmnet-helper binds it only after dropping
//	                         privileges.
//	SUDO_UID, SUDO_GID       as for vmnet-helper: the ids it drops to when
//	                         it runs as root.
package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/helperproto"
)

const (
	fakeVersion = "v0.13.0-fake"
	fakeCommit  = "0000000000000000000000000000000000000000"
	// maxSocketLen is sizeof(sockaddr_un.sun_path)-1 on macOS (options.c
	// parse_socket): the fake refuses what vmnet-helper refuses on a Mac.
	maxSocketLen = 103
	// minFirstDatagram: connect_socket drops a first datagram shorter than
	// this (vfkit and krunkit send a 4-byte "VFKT").
	minFirstDatagram = 64
	// ethHeaderLen: the fake vmnet refuses a shorter frame as vmnet_write
	// does vfkit's "VFKT" (helper.c's comment in connect_socket); where
	// exactly vmnet draws the line is not in vmnet-helper's source.
	ethHeaderLen = 14
	// Socket buffers, as set_socket_buffers sets them (../shared/NOTES.md).
	sendBufferSize          = 65 * 1024
	recvBufferSize          = 4 * 1024 * 1024
	recvBufferSizeOffloaded = 8 * 1024 * 1024
)

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// Exit statuses of the forwarding goroutines (helper.c STATUS_*).
const (
	statusFailure = 1
	statusStopped = 2
)

// exit unwinds run with a status, as vmnet-helper's exit() does; the
// registered atexit handlers run first, last registered first.
type exit int

type helper struct {
	stdout, stderr io.Writer
	logMu          sync.Mutex
	verbose        bool
	atexit         []func()
}

func (h *helper) log(level, format string, args ...any) {
	if level == "DEBUG" && !h.verbose {
		return
	}
	h.logMu.Lock()
	defer h.logMu.Unlock()
	fmt.Fprintf(h.stderr, "%-5s %s\n", level, fmt.Sprintf(format, args...))
}

func (h *helper) exit(code int) { panic(exit(code)) }

// usage is options.c's usage(): the synopsis on stderr, then exit.
func (h *helper) usage(code int) {
	h.logMu.Lock()
	fmt.Fprint(h.stderr, "\nUse vmnet interface without privileges (fake)\n\n"+
		"    vmnet-helper (--fd FD|--socket SOCKET) [--interface-id UUID]\n"+
		"                 [--operation-mode shared|bridged|host] [--shared-interface NAME]\n"+
		"                 [--start-address ADDR] [--end-address ADDR] [--subnet-mask MASK]\n"+
		"                 [--network-id UUID] [--host-ip-address ADDR] [--host-subnet-mask MASK]\n"+
		"                 [--enable-tso] [--enable-checksum-offload] [--enable-isolation]\n"+
		"                 [--network NAME] [--list-shared-interfaces] [--stats-interval SECONDS]\n"+
		"                 [-v|--verbose] [--version] [-h|--help]\n\n")
	h.logMu.Unlock()
	h.exit(code)
}

func run(argv []string, stdout, stderr io.Writer) (code int) {
	h := &helper{stdout: stdout, stderr: stderr}
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		e, ok := r.(exit)
		if !ok {
			panic(r)
		}
		for i := len(h.atexit) - 1; i >= 0; i-- {
			h.atexit[i]()
		}
		code = int(e)
	}()
	if path := os.Getenv("FAKE_VMNET_HELPER_ARGV"); path != "" {
		b, _ := json.Marshal(argv)
		if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
			h.log("ERROR", "writing FAKE_VMNET_HELPER_ARGV: %v", err)
			return 1
		}
	}
	o := h.parseOptions(argv)
	h.serve(argv[0], o)
	return 0 // not reached: serve ends with h.exit
}

// options is options.h's struct options; nil pointers are options not given.
type options struct {
	fd                                   int
	socket                               *string
	interfaceID                          string
	operationMode                        string // "" until given or defaulted
	sharedInterface                      *string
	startAddress, endAddress, subnetMask *string
	networkID                            string
	hostIPAddress, hostSubnetMask        *string
	networkName                          *string
	tso, checksumOffload, isolation      bool
	statsInterval                        int
	uid, gid                             int
}

type longOption struct {
	name   string
	hasArg bool
}

// longOptions and the short options ":f:s:i:vh" are options.c's.
var longOptions = []longOption{
	{"fd", true}, {"socket", true}, {"interface-id", true},
	{"operation-mode", true}, {"shared-interface", true},
	{"start-address", true}, {"end-address", true}, {"subnet-mask", true},
	{"network-id", true}, {"host-ip-address", true}, {"host-subnet-mask", true},
	{"enable-tso", false}, {"enable-checksum-offload", false}, {"enable-isolation", false},
	{"list-shared-interfaces", false}, {"network", true}, {"stats-interval", true},
	{"verbose", false}, {"version", false}, {"help", false},
}

var shortOptions = map[byte]string{'f': "fd", 's': "socket", 'i': "interface-id", 'v': "verbose", 'h': "help"}

// parseOptions is options.c's parse_options: each option is checked as it
// comes (some print the usage), then the combinations, then fd/socket,
// then $SUDO_UID and $SUDO_GID.
func (h *helper) parseOptions(argv []string) *options {
	o := &options{fd: -1}
	h.readOptions(o, argv[1:])
	h.checkCombinations(o)
	h.checkEndpoint(o)
	h.dropTo(o)
	return o
}

// readOptions is parse_options' getopt_long loop over args: each option
// checked as it comes (h.option).
func (h *helper) readOptions(o *options, args []string) {
	invalid := func(optname string) {
		h.log("ERROR", "Invalid option: %s", optname)
		h.exit(1)
	}
	// nextArg takes the option's argument from the word after args[*i].
	nextArg := func(i *int, optname string) string {
		if *i+1 >= len(args) {
			h.log("ERROR", "Option %s requires an argument", optname)
			h.exit(1)
		}
		*i++
		return args[*i]
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		optname := arg // options.c: optname = argv[optind]
		if arg == "--" {
			break
		}
		var name, value string
		switch {
		case strings.HasPrefix(arg, "--"):
			n, v, eq := strings.Cut(arg[2:], "=")
			opt, ok := matchLong(n)
			if !ok || (eq && !opt.hasArg) {
				invalid(optname)
			}
			name = opt.name
			if opt.hasArg {
				if eq {
					value = v
				} else {
					value = nextArg(&i, optname)
				}
			}
			h.option(o, name, optname, value)
		case strings.HasPrefix(arg, "-") && len(arg) > 1:
			for j := 1; j < len(arg); j++ {
				n, ok := shortOptions[arg[j]]
				if !ok {
					invalid(optname)
				}
				if n == "fd" || n == "socket" || n == "interface-id" {
					if j+1 < len(arg) {
						value = arg[j+1:]
					} else {
						value = nextArg(&i, optname)
					}
					h.option(o, n, optname, value)
					break
				}
				h.option(o, n, optname, "")
			}
		default:
			// Not an option: getopt_long moves it to the end and
			// parse_options never looks at it.
		}
	}
}

// checkCombinations checks the network options together: --network
// alone, or the options of the operation mode.
func (h *helper) checkCombinations(o *options) {
	fail := func(msg string) {
		h.log("ERROR", "%s", msg)
		h.exit(1)
	}
	if o.networkName != nil {
		// --network excludes the options that define a network.
		for _, c := range []struct {
			set  bool
			flag string
		}{
			{o.operationMode != "", "--operation-mode"},
			{o.sharedInterface != nil, "--shared-interface"},
			{o.startAddress != nil, "--start-address"},
			{o.endAddress != nil, "--end-address"},
			{o.subnetMask != nil, "--subnet-mask"},
			{o.networkID != "", "--network-id"},
			{o.hostIPAddress != nil, "--host-ip-address"},
			{o.hostSubnetMask != nil, "--host-subnet-mask"},
		} {
			if c.set {
				fail("Conflicting arguments: --network cannot be used with " + c.flag)
			}
		}
	} else {
		if o.operationMode == "" {
			o.operationMode = "shared"
		}
		addrs := 0
		for _, p := range []*string{o.startAddress, o.endAddress, o.subnetMask} {
			if p != nil {
				addrs++
			}
		}
		validateNetworkOptions := func() {
			if addrs != 0 && addrs != 3 {
				fail("--start-address, --end-address, and --subnet-mask must be given together, or all omitted")
			}
		}
		switch o.operationMode {
		case "shared":
			validateNetworkOptions()
			switch {
			case o.networkID != "":
				fail("--network-id cannot be used with operation-mode=shared")
			case o.hostIPAddress != nil:
				fail("--host-ip-address cannot be used with operation-mode=shared")
			case o.hostSubnetMask != nil:
				fail("--host-subnet-mask cannot be used with operation-mode=shared")
			}
			// --enable-isolation is allowed: helper.c passes it to vmnet.
		case "host":
			validateNetworkOptions()
			hostAddrs := 0
			for _, p := range []*string{o.hostIPAddress, o.hostSubnetMask} {
				if p != nil {
					hostAddrs++
				}
			}
			switch {
			case hostAddrs != 0 && o.networkID == "":
				fail("--host-ip-address and --host-subnet-mask require --network-id")
			case hostAddrs != 0 && hostAddrs != 2:
				fail("--host-ip-address and --host-subnet-mask must be given together, or all omitted")
			case o.networkID != "" && addrs != 0:
				fail("--network-id cannot be used with --start-address, --end-address, --subnet-mask")
			}
		case "bridged":
			// The address options are not checked here, and helper.c does
			// not pass them to vmnet in bridged mode: they are ignored.
			switch {
			case o.networkID != "":
				fail("--network-id cannot be used with operation-mode=bridged")
			case o.hostIPAddress != nil:
				fail("--host-ip-address cannot be used with operation-mode=bridged")
			case o.hostSubnetMask != nil:
				fail("--host-subnet-mask cannot be used with operation-mode=bridged")
			case o.sharedInterface == nil:
				fail("Missing argument: shared-interface is required for operation-mode=bridged")
			case o.isolation:
				fail("Conflicting arguments: enable-isolation cannot be used with bridged mode")
			}
		}
	}
}

// checkEndpoint checks that one of --fd and --socket is given.
func (h *helper) checkEndpoint(o *options) {
	if o.fd == -1 && o.socket == nil {
		h.log("ERROR", `Missing argument: either "fd" or "socket" required`)
		h.usage(1)
	}
	if o.fd != -1 && o.socket != nil {
		h.log("ERROR", `Conflicting arguments: "fd" and "socket" are mutually exclusive`)
		h.usage(1)
	}
}

// dropTo sets the ids the helper drops to.
func (h *helper) dropTo(o *options) {
	// The ids to drop to: $SUDO_UID/$SUDO_GID when set (even empty), else
	// the real ids.
	o.uid, o.gid = os.Getuid(), os.Getgid()
	for _, e := range []struct {
		name string
		dst  *int
	}{{"SUDO_UID", &o.uid}, {"SUDO_GID", &o.gid}} {
		v, ok := os.LookupEnv(e.name)
		if !ok {
			continue
		}
		n, rest, errno := strtol(v)
		switch {
		case errno != nil:
			h.log("ERROR", "Invalid %s '%s': %s", e.name, v, strerror(errno))
			h.usage(1)
		case rest != "" || n < 0 || n > math.MaxUint32:
			h.log("ERROR", "Invalid %s '%s'", e.name, v)
			h.usage(1)
		}
		*e.dst = int(n)
	}
}

// matchLong is getopt_long's lookup: an exact name, or a prefix of exactly
// one name.
func matchLong(n string) (longOption, bool) {
	var found []longOption
	for _, o := range longOptions {
		if o.name == n {
			return o, true
		}
		if n != "" && strings.HasPrefix(o.name, n) {
			found = append(found, o)
		}
	}
	if len(found) == 1 {
		return found[0], true
	}
	return longOption{}, false
}

// option handles one option as parse_options' switch does.
func (h *helper) option(o *options, name, optname, value string) {
	switch name {
	case "help":
		h.usage(0)
	case "fd":
		n, rest, errno := strtol(value)
		switch {
		case errno != nil:
			h.log("ERROR", "Invalid fd '%s': %s", value, strerror(errno))
			h.usage(1)
		case rest != "" || n < 0 || n > math.MaxInt32:
			h.log("ERROR", "Invalid fd '%s'", value)
			h.usage(1)
		}
		o.fd = int(n)
	case "socket":
		if len(value) > maxSocketLen {
			h.log("ERROR", `Socket "%s" too long (%d > %d)`, value, len(value), maxSocketLen)
			h.usage(1)
		}
		o.socket = &value
	case "interface-id":
		if !api.ValidInterfaceID(value) { // uuid_parse
			h.log("ERROR", `Invalid interface-id: "%s"`, value)
			h.exit(1)
		}
		o.interfaceID = strings.ToUpper(value)
	case "network-id":
		if !api.ValidInterfaceID(value) {
			h.log("ERROR", `Invalid network-id: "%s"`, value)
			h.exit(1)
		}
		o.networkID = value
	case "operation-mode":
		switch value {
		case "shared", "bridged", "host":
			o.operationMode = value
		default:
			h.log("ERROR", `Invalid %s: "%s"`, optname, value)
			h.exit(1)
		}
	case "shared-interface":
		o.sharedInterface = &value // options.c: "Validate?"
	case "start-address", "end-address", "subnet-mask", "host-ip-address", "host-subnet-mask":
		if _, ok := inetAton(value); !ok {
			h.log("ERROR", `Invalid %s: "%s"`, optname, value)
			h.exit(1)
		}
		*map[string]**string{"start-address": &o.startAddress, "end-address": &o.endAddress,
			"subnet-mask": &o.subnetMask, "host-ip-address": &o.hostIPAddress,
			"host-subnet-mask": &o.hostSubnetMask}[name] = &value
	case "enable-tso":
		o.tso = true
	case "enable-checksum-offload":
		o.checksumOffload = true
	case "enable-isolation":
		o.isolation = true
	case "list-shared-interfaces":
		fmt.Fprint(h.stdout, "en0\nen1\n")
		h.exit(0)
	case "network":
		o.networkName = &value
	case "stats-interval":
		n, rest, errno := strtol(value)
		if errno != nil || rest != "" || n < 1 || n > math.MaxInt32 {
			h.log("ERROR", "Invalid --stats value '%s': must be a positive integer", value)
			h.exit(1)
		}
		o.statsInterval = int(n)
	case "verbose":
		h.verbose = true
	case "version":
		fmt.Fprintf(h.stdout, "version: %s\ncommit: %s\n", fakeVersion, fakeCommit)
		h.exit(0)
	}
}

// strtol is C's strtol in base 10 as darwin's libc does it: leading
// spaces and a sign allowed; errno EINVAL when there are no digits, ERANGE
// past 64 bits; rest is what follows the number.
func strtol(s string) (n int64, rest string, errno error) {
	i := 0
	for i < len(s) && strings.IndexByte(" \t\n\v\f\r", s[i]) >= 0 {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	start := i
	var v uint64
	overflow := false
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		d := uint64(s[i] - '0')
		if v > (math.MaxUint64-d)/10 {
			overflow = true
		} else {
			v = v*10 + d
		}
		i++
	}
	if i == start {
		return 0, s, syscall.EINVAL
	}
	limit := uint64(math.MaxInt64)
	if neg {
		limit++
	}
	if overflow || v > limit {
		return 0, s[i:], syscall.ERANGE
	}
	if neg {
		return -int64(v), s[i:], nil
	}
	return int64(v), s[i:], nil
}

// inetAton is inet_aton(3): one to four numbers separated by dots, each
// decimal, octal (leading 0) or hex (0x), the last filling the remaining
// bytes; trailing white space is allowed.
func inetAton(s string) (netip.Addr, bool) {
	s = strings.TrimRight(s, " \t\n\v\f\r")
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals []uint64
	for _, p := range parts {
		base := 10
		switch {
		case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
			base, p = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		if p == "" && base != 16 {
			return netip.Addr{}, false
		}
		v, err := strconv.ParseUint(p, base, 32)
		if p != "" && err != nil {
			return netip.Addr{}, false
		}
		vals = append(vals, v)
	}
	var addr uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		addr |= v << (24 - 8*i)
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	addr |= last
	return netip.AddrFrom4([4]byte{byte(addr >> 24), byte(addr >> 16), byte(addr >> 8), byte(addr)}), true
}

// strerror is darwin's strerror text for errno.
func strerror(err error) string {
	s := err.Error()
	var errno syscall.Errno
	if errors.As(err, &errno) {
		s = errno.Error()
	}
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func signalName(s os.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "Terminated"
	case syscall.SIGINT:
		return "Interrupt"
	}
	return s.String()
}

type direction struct {
	mu sync.Mutex
	c  helperproto.Counters
}

func (d *direction) add(f func(c *helperproto.Counters)) {
	d.mu.Lock()
	f(&d.c)
	d.mu.Unlock()
}

func (d *direction) get() helperproto.Counters {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c
}

// serve is helper.c's main after parse_options. It ends with h.exit.
func (h *helper) serve(prog string, o *options) {
	mode := h.fakeMode()
	// check_os_version: the fake is a macOS 26, so --network is fine.
	h.log("INFO", "[main] running %s %s on macOS 26.0.0", prog, fakeVersion)
	h.log("INFO", "[main] running as uid: %d gid: %d", os.Geteuid(), os.Getegid())
	h.log("INFO", "[main] using bulk_forwarding: false")
	term, onSignal := h.setupKQ(mode)
	ready := h.startInterface(mode, o, term, onSignal)
	h.dropPrivileges(o)
	fd := h.setupSocket(o, term, onSignal)
	h.run(fd, ready.MaxPacketSize, o, term, onSignal)
}

// fakeMode is $FAKE_VMNET_HELPER_MODE: "" (a working helper), "fail"
// (vmnet refuses to start), "hang" (it never answers) or "ignore-term".
func (h *helper) fakeMode() string {
	mode := os.Getenv("FAKE_VMNET_HELPER_MODE")
	switch mode {
	case "", "fail", "hang", "ignore-term":
	default:
		h.log("ERROR", "[main] unknown FAKE_VMNET_HELPER_MODE %q", mode)
		h.exit(1)
	}
	return mode
}

// setupKQ is setup_kq: SIGTERM and SIGINT end the helper from here on, and
// SIGPIPE is ignored (a closed stderr must not kill it before its atexit
// handlers run). onSignal ends the helper for a signal from term.
func (h *helper) setupKQ(mode string) (term chan os.Signal, onSignal func(os.Signal)) {
	signal.Ignore(syscall.SIGPIPE)
	term = make(chan os.Signal, 1)
	if mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
		signal.Notify(term, syscall.SIGINT)
	} else {
		signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	}
	onSignal = func(s os.Signal) {
		h.log("INFO", "[main] received signal %s", signalName(s))
		h.exit(0)
	}
	return term, onSignal
}

// startInterface is start_host_interface: the ready line, or as the mode
// says, a failure or a hang.
func (h *helper) startInterface(mode string, o *options, term chan os.Signal, onSignal func(os.Signal)) helperproto.Ready {
	h.log("DEBUG", "[main] starting vmnet interface")
	switch mode {
	case "fail":
		if o.networkName != nil {
			h.log("ERROR", "[main] vmnet_interface_start_with_network: VMNET_FAILURE")
		} else {
			h.log("ERROR", "[main] vmnet_start_interface: VMNET_FAILURE")
		}
		h.exit(1)
	case "hang":
		onSignal(<-term)
	}
	if o.networkName != nil && o.interfaceID != "" {
		h.log("WARN", "[main] --interface-id is ignored with --network")
		o.interfaceID = ""
	}
	ready := readyFor(o)
	fmt.Fprintln(h.stdout, shuffledJSON(ready))
	h.atexit = append(h.atexit, func() {
		h.log("DEBUG", "[main] stopping vmnet interface")
		h.log("INFO", "[main] stopped vmnet interface")
	})
	h.log("INFO", "[main] started vmnet interface")
	return ready
}

// dropPrivileges is drop_privileges: only root can.
func (h *helper) dropPrivileges(o *options) {
	if os.Geteuid() == 0 {
		if o.gid != 0 {
			if err := syscall.Setgid(o.gid); err != nil {
				h.log("ERROR", "[main] unable to change gid to %d: %s", o.gid, strerror(err))
				h.exit(1)
			}
		}
		if o.uid != 0 {
			if err := syscall.Setuid(o.uid); err != nil {
				h.log("ERROR", "[main] unable to change uid to %d: %s", o.uid, strerror(err))
				h.exit(1)
			}
		}
		if o.gid != 0 || o.uid != 0 {
			h.log("INFO", "[main] dropped privileges to uid: %d gid: %d", os.Geteuid(), os.Getegid())
		}
	}
}

// setupSocket is setup_socket: the fd given, or the socket made, once a
// client connected to it.
func (h *helper) setupSocket(o *options, term chan os.Signal, onSignal func(os.Signal)) int {
	fd := o.fd
	if o.socket != nil {
		if d, err := time.ParseDuration(os.Getenv("FAKE_VMNET_HELPER_SOCKET_DELAY")); err == nil {
			time.Sleep(d)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
		fd = h.createSocket(*o.socket, o.tso)
		h.waitForClient(fd, *o.socket, term, onSignal)
	} else {
		h.log("DEBUG", "[main] using fd %d", fd)
	}
	return fd
}

// run forwards frames between fd and the fake vmnet
// (start_forwarding_from_host, start_forwarding_from_vm), logs stats with
// --stats-interval, and runs until a signal or a shutdown ends it.
func (h *helper) run(fd, maxPacketSize int, o *options, term chan os.Signal, onSignal func(os.Signal)) {
	var host, vm direction
	shutdown := make(chan int, 2)
	mirror := make(chan []byte, 256) // the fake vmnet's queue back to the VM
	go h.forwardFromHost(fd, mirror, &host)
	h.log("INFO", "[main] started host forwarding")
	go h.forwardFromVM(fd, maxPacketSize, mirror, &vm, shutdown)
	h.log("INFO", "[main] started vm forwarding")

	// start_stats_timer: only with --stats-interval.
	var tick <-chan time.Time
	if o.statsInterval > 0 {
		period := time.Duration(o.statsInterval) * time.Second
		if d, err := time.ParseDuration(os.Getenv("FAKE_VMNET_HELPER_TICK")); err == nil && d > 0 {
			period = d
		}
		t := time.NewTicker(period)
		defer t.Stop()
		tick = t.C
		h.log("INFO", "[main] reporting stats every %d seconds", o.statsInterval)
	}

	// run_until_termination
	h.log("INFO", "[main] running")
	for {
		select {
		case s := <-term:
			onSignal(s)
		case status := <-shutdown:
			h.log("INFO", "[main] received shutdown event")
			if status&statusStopped != 0 {
				h.exit(0)
			}
			h.exit(1)
		case now := <-tick:
			line := helperproto.FormatStatsLine(helperproto.Stats{Time: now, Host: host.get(), VM: vm.get()})
			h.logMu.Lock()
			fmt.Fprintln(h.stderr, line)
			h.logMu.Unlock()
		}
	}
}

// createSocket is create_socket_lockfile and create_socket: the lock, then
// a unixgram socket bound at path with mode 0600. vmnet-helper binds and
// then chmods (racy, its comment says); the fake binds under a umask that
// gives 0600 from the start and chmods too, so that tests checking the mode
// right after the path appears do not race. The end state is the same.
func (h *helper) createSocket(path string, offloads bool) int {
	lockPath := path + ".lock"
	lock, err := syscall.Open(lockPath, syscall.O_RDONLY|syscall.O_CREAT|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o600)
	if err == nil {
		if err = syscall.Flock(lock, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			syscall.Close(lock)
		}
	}
	if err != nil {
		h.log("ERROR", `[main] open("%s"): %s`, lockPath, strerror(err))
		h.exit(1)
	}
	h.removeAtExit("lockfile", lockPath)

	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		h.log("ERROR", "[main] socket: %s", strerror(err))
		h.exit(1)
	}
	syscall.CloseOnExec(fd)
	// set_socket_buffers: a failure is only a warning.
	rcvbuf := recvBufferSize
	if offloads {
		rcvbuf = recvBufferSizeOffloaded
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, sendBufferSize); err != nil {
		h.log("WARN", "[main] setsockopt: %s", strerror(err))
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf); err != nil {
		h.log("WARN", "[main] setsockopt: %s", strerror(err))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.log("ERROR", `[main] remove("%s"): %s`, path, strerror(errors.Unwrap(err)))
		h.exit(1)
	}
	oldMask := syscall.Umask(0o177)
	err = syscall.Bind(fd, &syscall.SockaddrUnix{Name: path})
	syscall.Umask(oldMask)
	if err != nil {
		h.log("ERROR", `[main] bind("%s"): %s`, path, strerror(err))
		h.exit(1)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		h.log("ERROR", "[main] fchmod: %s", strerror(errors.Unwrap(err)))
		h.exit(1)
	}
	h.removeAtExit("socket", path)
	return fd
}

// removeAtExit logs that the file at path (what: lockfile, socket) was
// created and removes it at exit, as vmnet-helper does.
func (h *helper) removeAtExit(what, path string) {
	h.atexit = append(h.atexit, func() {
		h.log("DEBUG", `[main] remove %s "%s"`, what, path)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			h.log("WARN", `[main] remove("%s"): %s`, path, strerror(errors.Unwrap(err)))
		}
	})
	h.log("DEBUG", `[main] created %s "%s"`, what, path)
}

// waitForClient is wait_for_client and connect_socket: the first datagram
// names the client, which the socket is then connected to (later clients
// are ignored); a first datagram shorter than 64 bytes is dropped.
func (h *helper) waitForClient(fd int, path string, term <-chan os.Signal, onSignal func(os.Signal)) {
	h.log("INFO", `[main] waiting for client on "%s"`, path)
	type peeked struct {
		n    int
		from syscall.Sockaddr
		err  error
	}
	got := make(chan peeked, 1)
	go func() {
		buf := make([]byte, minFirstDatagram)
		for {
			n, from, err := syscall.Recvfrom(fd, buf, syscall.MSG_PEEK)
			if err == syscall.EINTR {
				continue
			}
			got <- peeked{n, from, err}
			return
		}
	}()
	var p peeked
	select {
	case s := <-term:
		onSignal(s)
	case p = <-got:
	}
	if p.err != nil {
		h.log("ERROR", "[main] recvfrom: %s", strerror(p.err))
		h.exit(1)
	}
	client := ""
	if ua, ok := p.from.(*syscall.SockaddrUnix); ok {
		client = ua.Name
	}
	h.log("DEBUG", `[main] connecting to "%s"`, client)
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: client}); err != nil || client == "" {
		if err == nil {
			err = syscall.EINVAL // an unbound client has no address to connect to
		}
		h.log("ERROR", `[main] connect("%s"): %s`, client, strerror(err))
		h.exit(1)
	}
	if p.n < minFirstDatagram {
		h.log("DEBUG", "[main] dropping invalid packet (%d bytes)", p.n)
		buf := make([]byte, minFirstDatagram)
		if _, err := syscall.Read(fd, buf); err != nil {
			h.log("ERROR", "[main] read: %s", strerror(err))
			h.exit(1)
		}
	}
	h.log("INFO", `[main] serving client "%s"`, client)
}

// forwardFromVM is forward_from_vm on the slow path: one read per frame,
// counted in "slow" as it starts; a frame counts in packets and bytes once
// the fake vmnet took it. It ends the helper on a read error (exit 1) or a
// zero-length datagram, which vmnet-helper takes as the peer closing (exit 0).
func (h *helper) forwardFromVM(fd, maxPacketSize int, mirror chan<- []byte, vm *direction, shutdown chan<- int) {
	h.log("DEBUG", "[vm->host] started")
	defer h.log("INFO", "[vm->host] stopped")
	buf := make([]byte, maxPacketSize)
	for {
		vm.add(func(c *helperproto.Counters) { c.Slow++ })
		n, err := syscall.Read(fd, buf)
		for err == syscall.EINTR {
			n, err = syscall.Read(fd, buf)
		}
		if err != nil {
			h.log("ERROR", "[vm->host] read: %s", strerror(err))
			shutdown <- statusFailure
			return
		}
		if n == 0 {
			h.log("INFO", "[vm->host] socket was closed by peer")
			shutdown <- statusStopped
			return
		}
		// vmnet_write, by the fake vmnet: it refuses a frame without an
		// Ethernet header, and mirrors the others back to the VM (dropping
		// them, as a full vmnet queue would, if the VM does not read).
		if n < ethHeaderLen {
			h.log("ERROR", "[vm->host] vmnet_write: VMNET_INVALID_ARGUMENT")
			shutdown <- statusFailure
			return
		}
		frame := append([]byte(nil), buf[:n]...)
		select {
		case mirror <- frame:
		default:
		}
		vm.add(func(c *helperproto.Counters) { c.Packets++; c.Bytes += uint64(n) })
		h.log("DEBUG", "[vm->host] forwarded 1 packets %d bytes", n)
	}
}

// forwardFromHost is write_to_vm on the slow path: one write per frame
// from the fake vmnet, counted in "slow"; a failed write is a drop.
func (h *helper) forwardFromHost(fd int, mirror <-chan []byte, host *direction) {
	for frame := range mirror {
		var err error
		writes := uint64(0)
		for {
			writes++
			_, err = syscall.Write(fd, frame)
			if err == syscall.ENOBUFS || err == syscall.EINTR {
				time.Sleep(50 * time.Microsecond) // VM_RETRY_DELAY
				continue
			}
			break
		}
		if err != nil {
			h.log("ERROR", "[host->vm] write: %s", strerror(err))
			host.add(func(c *helperproto.Counters) { c.Drops++; c.Slow += writes })
			continue
		}
		host.add(func(c *helperproto.Counters) { c.Packets++; c.Bytes += uint64(len(frame)); c.Slow += writes })
		h.log("DEBUG", "[host->vm] forwarded 1 packets %d bytes 0 drops 0 fast %d slow", len(frame), writes)
	}
}

// readyFor is what vmnet answers for o: the keys of vmnet's interface
// parameters (vmnet_start_interface's callback), and with --network the
// net_* keys write_interface_info adds. Addresses are the given ones or
// vmnet's defaults; bridged mode has none (helper.c passes none to vmnet).
func readyFor(o *options) helperproto.Ready {
	id := o.interfaceID
	if id == "" {
		id = randomUUID() // vmnet picks one
	}
	r := helperproto.Ready{
		MACAddress: mac(id), MTU: 1500, MaxPacketSize: 1514, InterfaceID: id,
		ReadMaxPackets: 256, WriteMaxPackets: 256,
	}
	if o.tso {
		r.MaxPacketSize = 65550
	}
	addrs := func(start, end, mask string) {
		if o.startAddress != nil {
			start, end, mask = *o.startAddress, *o.endAddress, *o.subnetMask
		}
		r.StartAddress, _ = inetAton(start)
		r.EndAddress, _ = inetAton(end)
		r.SubnetMask, _ = inetAton(mask)
	}
	switch {
	case o.networkName != nil:
		addrs("192.168.105.1", "192.168.105.254", "255.255.255.0")
		r.NAT66Prefix = "fd9b:5a14:ba57:e3d3::"
		r.IPv4Subnet = netip.MustParseAddr("192.168.105.0")
		r.IPv4Mask = netip.MustParseAddr("255.255.255.0")
		r.IPv6Prefix, r.IPv6PrefixLen = "fd9b:5a14:ba57:e3d3::", 64
	case o.operationMode == "shared":
		addrs("192.168.105.1", "192.168.105.254", "255.255.255.0")
		r.NAT66Prefix = "fd9b:5a14:ba57:e3d3::"
	case o.operationMode == "host":
		addrs("192.168.106.1", "192.168.106.254", "255.255.255.0")
	}
	return r
}

// shuffledJSON is r as write_interface_info prints it: compact, in the
// order of vmnet's xpc dictionary, which is no order to rely on.
func shuffledJSON(r helperproto.Ready) string {
	b, err := r.MarshalJSON()
	if err != nil {
		panic(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	mrand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		parts[i] = string(kb) + ":" + string(m[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// mac is what vmnet does for an interface id: the same id, the same MAC.
func mac(id string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("fake-vmnet/" + id))
	sum[0] = sum[0]&^0x01 | 0x02
	return net.HardwareAddr(sum[:6])
}

func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%X-%X-%X-%X-%X", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
