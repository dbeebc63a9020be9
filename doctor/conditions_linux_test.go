package doctor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmnetctl/vmnetctl/api"
	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// Bad conditions set up through the paths and probes doctor reads (package
// variables) or fake commands on PATH, each found with a fix; the firewall
// findings clear once their printed fix is applied.

func loadNets(t *testing.T, yaml string) []*api.Network {
	t.Helper()
	nets, diags := api.LoadNetworks("n.yaml", []byte(yaml))
	if diags.HasErrors() {
		t.Fatal(diags.Err())
	}
	return nets.Networks
}

const sharedYAML = "vmnet:\n  shared:\n    subnet: 10.93.0.0/24\n"

func setVar[T any](t *testing.T, v *T, to T) {
	old := *v
	*v = to
	t.Cleanup(func() { *v = old })
}

// fakeCommands puts scripts named like the keys, with the values as their
// bodies, first on PATH (alone on it, with the shell's own directories, if
// only is true), and returns their directory.
func fakeCommands(t *testing.T, only bool, scripts map[string]string) string {
	dir := t.TempDir()
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := dir + ":" + os.Getenv("PATH")
	if only {
		path = dir + ":/usr/bin:/bin"
	}
	t.Setenv("PATH", path)
	return dir
}

func one(t *testing.T, fs []Finding, check string) Finding {
	t.Helper()
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	t.Fatalf("no %s finding in %+v", check, fs)
	return Finding{}
}

// applyFix runs the commands a finding's fix prints (each "sudo ..." of
// it, split at "&&" and ";"), without sudo: the tests run as root or on
// fakes. run runs one command.
func applyFix(t *testing.T, fix string, run func(argv []string) error) {
	t.Helper()
	n := 0
	for _, part := range strings.FieldsFunc(strings.ReplaceAll(fix, "&&", ";"), func(r rune) bool { return r == ';' }) {
		_, cmd, ok := strings.Cut(part, "sudo ")
		if !ok {
			continue
		}
		n++
		if err := run(strings.Fields(cmd)); err != nil {
			t.Fatalf("applying %q: %v", cmd, err)
		}
	}
	if n == 0 {
		t.Fatalf("no command in the fix %q", fix)
	}
}

func TestDoctorTunMissing(t *testing.T) {
	setVar(t, &tunPath, filepath.Join(t.TempDir(), "tun"))
	f := one(t, checkTun(context.Background(), nil), "/dev/net/tun")
	if f.Status != Fail || !strings.Contains(f.Detail, "no such file") || !strings.Contains(f.Fix, "modprobe tun") {
		t.Errorf("%+v, want a failure to open it, fixed by modprobe tun", f)
	}
	if os.Geteuid() == 0 {
		// up's preflight stops at it, with the same words.
		if err := Preflight(context.Background()); err == nil || !strings.Contains(err.Error(), "modprobe tun") {
			t.Errorf("Preflight: %v, want the tun failure and its fix", err)
		}
	}
}

func TestDoctorKernelFeatureMissing(t *testing.T) {
	testutil.RequireRoot(t, "probes kernel features in network namespaces")
	features := append(kernelFeatures[:0:0], kernelFeatures...)
	broken := errors.New("operation not supported")
	for i := range features {
		if n := features[i].name; n == "bridge" || n == "vxlan" || n == "macvtap" {
			features[i].probe = func() error { return broken }
		}
	}
	setVar(t, &kernelFeatures, features)
	bridged := loadNets(t, "vmnet:\n  br:\n    mode: bridged\n    interface: eth0\n")
	fs := checkKernel(context.Background(), bridged)
	for check, want := range map[string]Status{
		"kernel: bridge":  Fail, // always needed
		"kernel: macvtap": Warn, // a bridged network needs it
		"kernel: vxlan":   Info, // nothing needs it
	} {
		f := one(t, fs, check)
		if f.Status != want || !strings.Contains(f.Detail, broken.Error()) || !strings.Contains(f.Fix, "modprobe") {
			t.Errorf("%s: %+v, want %s naming the error, with a fix", check, f, want)
		}
	}
	if f := one(t, checkKernel(context.Background(), loadNets(t, sharedYAML)), "kernel: macvtap"); f.Status != Info {
		t.Errorf("macvtap missing, no bridged network: %+v, want info", f)
	}
}

func TestDoctorQemuVersion(t *testing.T) {
	for _, tt := range []struct {
		says   string
		status Status
		fix    string
	}{
		{"QEMU emulator version 7.0.0 (Debian 1:7.0+dfsg-7)", Warn, "attach: tap"},
		{"QEMU emulator version 8.2.2", OK, ""},
		{"qemu, unversioned", Warn, "7.2"},
	} {
		fakeCommands(t, true, map[string]string{"qemu-system-x86_64": "echo '" + tt.says + "'"})
		f := one(t, checkQemu(context.Background(), nil), "qemu")
		if f.Status != tt.status || !strings.Contains(f.Fix, tt.fix) || (tt.status != OK) != (f.Fix != "") {
			t.Errorf("qemu saying %q: %+v, want %s with a fix saying %q", tt.says, f, tt.status, tt.fix)
		}
	}
}

func TestDoctorForwardingOff(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ip_forward")
	setVar(t, &ipForwardPath, file)
	for _, tt := range []struct {
		value, yaml string
		status      Status
		says        string
	}{
		{"0\n", sharedYAML, Info, "turns it on"},
		{"0\n", "vmnet:\n  h:\n    mode: host\n    subnet: 10.94.0.0/24\n", OK, "no shared network"},
		{"1\n", sharedYAML, OK, "on"},
	} {
		os.WriteFile(file, []byte(tt.value), 0o644)
		f := one(t, checkForwarding(context.Background(), loadNets(t, tt.yaml)), "IPv4 forwarding")
		if f.Status != tt.status || !strings.Contains(f.Detail, tt.says) {
			t.Errorf("ip_forward %q, %q: %+v, want %s saying %q", tt.value, tt.yaml, f, tt.status, tt.says)
		}
	}
}

// firewalld runs (a pid file naming a live process, this one) and its
// firewall-cmd (a fake keeping the trusted zone's interfaces in a file)
// does not have the bridge in the trusted zone: a warning; its fix, run,
// puts it there and the finding clears. Without firewall-cmd, a warning.
func TestDoctorFirewalld(t *testing.T) {
	pid := filepath.Join(t.TempDir(), "firewalld.pid")
	os.WriteFile(pid, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	setVar(t, &firewalldPidFile, pid)
	setVar(t, &ufwConf, filepath.Join(t.TempDir(), "none"))
	nets := loadNets(t, sharedYAML)
	bridge := nets[0].Bridge()

	fakeCommands(t, true, nil)
	if f := one(t, checkFirewalls(context.Background(), nets), "firewalld"); f.Status != Warn || !strings.Contains(f.Fix, "--add-interface="+bridge) {
		t.Errorf("firewalld without firewall-cmd: %+v, want a warning with the fix", f)
	}

	trusted := filepath.Join(t.TempDir(), "trusted")
	dir := fakeCommands(t, true, map[string]string{"firewall-cmd": `for a; do case "$a" in
  --add-interface=*) echo "${a#--add-interface=}" >>` + trusted + ` ;;
  --get-zone-of-interface=*) if grep -qx "${a#--get-zone-of-interface=}" ` + trusted + ` 2>/dev/null; then echo trusted; else echo "no zone"; exit 2; fi ;;
esac; done`})
	f := one(t, checkFirewalls(context.Background(), nets), "firewalld")
	if f.Status != Warn || !strings.Contains(f.Detail, bridge+" are not in its trusted zone") {
		t.Fatalf("firewalld, bridge in no zone: %+v, want a warning naming %s", f, bridge)
	}
	applyFix(t, f.Fix, func(argv []string) error {
		return exec.Command(filepath.Join(dir, argv[0]), argv[1:]...).Run()
	})
	if f := one(t, checkFirewalls(context.Background(), nets), "firewalld"); f.Status != OK {
		t.Errorf("firewalld once its fix is applied: %+v, want OK", f)
	}
}

// ufw is enabled (its ufw.conf says so) and its rules (a fake ufw keeping
// them in a file, listed by `ufw show added`) lack vmnetctl's: a warning;
// its fix, run, adds them and the finding clears.
func TestDoctorUfw(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "ufw.conf")
	os.WriteFile(conf, []byte("# ufw.conf\nENABLED=yes\nLOGLEVEL=low\n"), 0o644)
	setVar(t, &ufwConf, conf)
	setVar(t, &firewalldPidFile, filepath.Join(t.TempDir(), "none"))
	rules := filepath.Join(t.TempDir(), "rules")
	os.WriteFile(rules, []byte("ufw allow 22/tcp\nufw route allow in on vmn-+\n"), 0o644)
	dir := fakeCommands(t, true, map[string]string{"ufw": `if [ "$1 $2" = "show added" ]; then
  echo "Added user rules (see 'ufw status' for running firewall):"; cat ` + rules + `
else echo "ufw $*" >>` + rules + `; fi`})
	nets := loadNets(t, sharedYAML)
	f := one(t, checkFirewalls(context.Background(), nets), "ufw")
	if f.Status != Warn || strings.Contains(f.Fix, "route allow in") || !strings.Contains(f.Fix, "sudo ufw allow in on vmn-+") {
		t.Fatalf("ufw without vmnetctl's rules: %+v, want a warning whose fix adds the two missing rules", f)
	}
	applyFix(t, f.Fix, func(argv []string) error {
		return exec.Command(filepath.Join(dir, argv[0]), argv[1:]...).Run()
	})
	if f := one(t, checkFirewalls(context.Background(), nets), "ufw"); f.Status != OK {
		t.Errorf("ufw once its fix is applied: %+v, want OK", f)
	}
}

// iptables' FORWARD policy DROP, as Docker sets it (with its DOCKER-USER
// chain) and without Docker, in a namespace of the test's own: a warning;
// the printed fix, run there, clears it.
func TestDoctorForwardDropFix(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	testutil.RequireCommands(t, "ip", "nft", "iptables")
	for _, tt := range []struct {
		name  string
		setup [][]string
		chain string
	}{
		{"docker", [][]string{{"-N", "DOCKER-USER"}, {"-A", "DOCKER-USER", "-j", "RETURN"}, {"-A", "FORWARD", "-j", "DOCKER-USER"}, {"-P", "FORWARD", "DROP"}}, "DOCKER-USER"},
		{"no docker", [][]string{{"-P", "FORWARD", "DROP"}}, "FORWARD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := testutil.NewNS(t, "fwd")
			for _, a := range tt.setup {
				ns.MustRun(t, "iptables", a...)
			}
			check := func() Finding {
				var fs []Finding
				if err := ns.Do(func() error { fs = checkDockerForward(context.Background(), nil); return nil }); err != nil {
					t.Fatal(err)
				}
				return one(t, fs, "FORWARD policy")
			}
			f := check()
			if f.Status != Warn || !strings.Contains(f.Fix, "iptables -I "+tt.chain+" -i vmn-+ -j ACCEPT") {
				t.Fatalf("FORWARD DROP: %+v, want a warning whose fix accepts vmn-+ in %s", f, tt.chain)
			}
			applyFix(t, f.Fix, func(argv []string) error {
				_, err := ns.Run(context.Background(), argv[0], argv[1:]...)
				return err
			})
			if f := check(); f.Status != OK {
				t.Errorf("FORWARD DROP once the printed fix is applied: %+v, want OK", f)
			}
		})
	}
}

// Where nft is not installed (iptables-legacy), the rules come from
// `iptables -S`: the same verdicts.
func TestForwardRulesFromIptablesSave(t *testing.T) {
	docker := "-P INPUT ACCEPT\n-P FORWARD DROP\n-P OUTPUT ACCEPT\n-N DOCKER\n-N DOCKER-USER\n-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\n"
	for _, tt := range []struct {
		save                  string
		drop, docker, in, out bool
	}{
		{"-P INPUT ACCEPT\n-P FORWARD ACCEPT\n", false, false, false, false},
		{docker, true, true, false, false},
		{docker + "-A DOCKER-USER -i vmn-+ -j ACCEPT\n", true, true, true, false},
		{docker + "-A DOCKER-USER -o vmn-+ -j ACCEPT\n-A DOCKER-USER -i vmn-+ -j ACCEPT\n", true, true, true, true},
		{"-P FORWARD DROP\n-A FORWARD -i vmn-+ -j DROP\n-A FORWARD -o vmn-+ -j ACCEPT\n", true, false, false, true},
	} {
		var r forwardRules
		r.parseSave(tt.save)
		if r.drop != tt.drop || r.docker != tt.docker || r.acceptIn != tt.in || r.acceptOut != tt.out {
			t.Errorf("%q: %+v, want drop %v docker %v in %v out %v", tt.save, r, tt.drop, tt.docker, tt.in, tt.out)
		}
	}
}

// A network across hosts: with none of the hosts' addresses here, a
// failure naming the hosts, whose fix is to list this host; with the
// address on an interface of too small an MTU, a failure whose fix raises
// it; with it raised, OK.
func TestDoctorVXLAN(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	nets := loadNets(t, "networks:\n  lab:\n    mode: shared\n    gateway: 10.95.0.1\n    netmask: 255.255.255.0\n"+
		"    vxlan: {vni: 7, hosts: [{name: a, address: 10.77.9.1}, {name: b, address: 10.77.9.2}]}\n")
	ns := testutil.NewNS(t, "docvx")
	run := func() Finding {
		var f Finding
		if err := ns.Do(func() error { f = one(t, checkVXLAN(context.Background(), nets), "hosts of lab"); return nil }); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := run(); f.Status != Fail || !strings.Contains(f.Detail, "a (10.77.9.1)") || !strings.Contains(f.Fix, "networks.lab.vxlan.hosts") {
		t.Errorf("no host's address here: %+v", f)
	}
	ns.MustRun(t, "ip", "link", "add", "ul0", "mtu", "1400", "type", "veth", "peer", "name", "ul1")
	ns.MustRun(t, "ip", "addr", "add", "10.77.9.2/24", "dev", "ul0")
	if f := run(); f.Status != Fail || !strings.Contains(f.Fix, "ip link set ul0 mtu 1500") {
		t.Errorf("underlay MTU 1400: %+v", f)
	}
	ns.MustRun(t, "ip", "link", "set", "ul0", "mtu", "1500")
	if f := run(); f.Status != OK || !strings.Contains(f.Detail, "this host is b (10.77.9.2 on ul0)") {
		t.Errorf("host b, MTU 1500: %+v", f)
	}
}
