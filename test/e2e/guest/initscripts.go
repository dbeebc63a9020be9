package guest

// The scripts baked into the base initramfs. They are part of the image cache
// key: changing them rebuilds the image.

// initScript is /init. It mounts the pseudo file systems, loads the network
// drivers, sources /e2e/lib.sh and runs the per-guest /e2e/script.sh (from
// the second, per-guest archive appended to the initrd), then powers off.
const initScript = `#!/bin/sh
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /tmp /run /var/run
echo 1 >/proc/sys/kernel/printk
exec </dev/null >/dev/console 2>&1
echo "E2E boot uptime=$(cut -d' ' -f1 /proc/uptime)"
. /e2e/lib.sh
while read -r m; do
	[ -n "$m" ] || continue
	insmod "/lib/modules/$m.ko" || e2e_final "fail insmod $m"
done </etc/e2e/modules
ip link set lo up
if [ -f /e2e/script.sh ]; then
	(. /e2e/script.sh)
	rc=$?
	if [ "$rc" -eq 0 ]; then
		e2e_final "done uptime=$(cut -d' ' -f1 /proc/uptime)"
	fi
	e2e_final "fail script exited with status $rc"
fi
e2e_final "fail no /e2e/script.sh in the initrd"
`

// libScript holds the shell functions the Go Script builder emits calls to.
// Every result is a console line "E2E key=value"; the last line is
// "E2E done ..." or "E2E fail reason".
const libScript = `# vmnetctl e2e guest library (busybox sh)
e2e_report() { k="$1"; shift; echo "E2E $k=$*"; }

# e2e_final LINE: print "E2E LINE", drain the serial port, power off.
e2e_final() {
	echo "E2E $*"
	stty -F /dev/ttyS0 -echo 2>/dev/null
	poweroff -f
	sleep 60
}

# e2e_fail REASON: abort the check script (init reports the failure).
e2e_fail() { echo "E2E fail $*"; exit 1; }

# e2e_wait SECONDS COMMAND...: poll COMMAND every 0.1 s until it succeeds or
# SECONDS pass.
e2e_wait() {
	_n=$(($1 * 10)); shift
	while ! "$@" >/dev/null 2>&1; do
		_n=$((_n - 1))
		[ "$_n" -gt 0 ] || return 1
		sleep 0.1
	done
}

e2e_link_up() {
	e2e_wait 10 test -e "/sys/class/net/$1" || { e2e_report "$1.link" missing; e2e_fail "no interface $1 ($(ls /sys/class/net | tr '\n' ' '))"; }
	ip link set "$1" up || e2e_fail "ip link set $1 up"
	e2e_report "$1.mac" "$(cat /sys/class/net/$1/address)"
}

e2e_addr() {
	e2e_link_up "$1"
	ip addr add "$2" dev "$1" || e2e_fail "ip addr add $2 dev $1"
	e2e_report "$1.ip" "$(ip -4 -o addr show dev $1 | awk '{print $4}' | cut -d/ -f1 | head -n1)"
}

e2e_dhcp() {
	e2e_link_up "$1"
	rm -f "/tmp/dhcp.$1"
	if timeout 60 udhcpc -i "$1" -s /e2e/udhcpc.sh -q -f -n -t 10 -T 1 >"/tmp/udhcpc.$1.log" 2>&1 && [ -f "/tmp/dhcp.$1" ]; then
		. "/tmp/dhcp.$1"
		e2e_report "$1.dhcp" ok
		e2e_report "$1.ip" "$ip"
		e2e_report "$1.prefix" "$prefix"
		e2e_report "$1.router" "$router"
		e2e_report "$1.dns" "$dns"
		e2e_report "$1.domain" "$domain"
		e2e_report "$1.mtu_option" "$mtu"
		e2e_report "$1.mtu" "$(cat /sys/class/net/$1/mtu)"
		e2e_report "$1.lease" "$lease"
		e2e_report "$1.server" "$serverid"
	else
		e2e_report "$1.dhcp" fail
		sed 's/^/udhcpc: /' "/tmp/udhcpc.$1.log"
		e2e_fail "no DHCP lease on $1"
	fi
}

# e2e_ping ADDR [KEY]
e2e_ping() {
	if ping -c 3 -W 2 "$1" >"/tmp/ping.log" 2>&1; then
		e2e_report "${2:-ping.$1}" ok
	else
		sed 's/^/ping: /' /tmp/ping.log
		e2e_report "${2:-ping.$1}" fail
	fi
}

# _e2e_lookup NAME SERVER TYPE SECONDS: nslookup -type=TYPE; sets _out (its
# output) and _addrs (the answer's addresses, comma separated).
_e2e_lookup() {
	_out=$(timeout "$4" nslookup -type="$3" "$1" "$2" 2>&1)
	_addrs=$(echo "$_out" | awk '/^Name:/ {f=1; next} f && /^Address/ {sub(/^Address[ 0-9]*:[ \t]*/, ""); print}' | tr '\n' ',' | sed 's/,$//')
}

# e2e_resolve NAME SERVER [KEY [TYPE]]: reports the addresses of the TYPE
# records (a, the default, or aaaa), comma separated, or fail.
e2e_resolve() {
	_e2e_lookup "$1" "$2" "${4:-a}" 20
	if [ -n "$_addrs" ]; then
		e2e_report "${3:-dns.$1}" "$_addrs"
	else
		echo "$_out" | sed 's/^/nslookup: /'
		e2e_report "${3:-dns.$1}" fail
	fi
}

# e2e_resolve_within NAME SERVER SECONDS [KEY [TYPE]]: e2e_resolve, retried
# every 0.5 s until the name resolves or SECONDS pass (another guest may not
# have its lease, or its IPv6 address, yet).
e2e_resolve_within() {
	_n=$(($3 * 2))
	while :; do
		_e2e_lookup "$1" "$2" "${5:-a}" 10
		if [ -n "$_addrs" ]; then e2e_report "${4:-dns.$1}" "$_addrs"; return 0; fi
		_n=$((_n - 1))
		echo "$_out" | sed "s/^/nslookup $1: /"
		if [ "$_n" -le 0 ]; then
			e2e_report "${4:-dns.$1}" fail
			return 1
		fi
		sleep 0.5
	done
}

# e2e_ipv6 IF: enable IPv6 and SLAAC (accept router advertisements,
# autoconfigure addresses) on IF. Call it before the link comes up, so that
# the router solicitation sent then is answered.
e2e_ipv6() {
	e2e_wait 10 test -e "/proc/sys/net/ipv6/conf/$1" || e2e_fail "no IPv6 on $1 (no /proc/sys/net/ipv6/conf/$1)"
	for _kv in disable_ipv6=0 forwarding=0 accept_ra=1 autoconf=1; do
		echo "${_kv#*=}" >"/proc/sys/net/ipv6/conf/$1/${_kv%%=*}" || e2e_fail "cannot set $_kv on $1"
	done
}

# _e2e_in6 ADDR PREFIX/LEN: whether IPv6 address ADDR is in the prefix (LEN
# a multiple of 4).
_e2e_in6() {
	echo "$1 $2" | awk '
	function pad(g) { return substr("0000" g, length(g) + 1) }
	function expand(a,   h, n, i, j, c, out, done) {
		n = split(a, h, ":"); c = 0
		for (i = 1; i <= n; i++) if (h[i] != "") c++
		out = ""; done = 0
		for (i = 1; i <= n; i++) {
			if (h[i] != "") out = out pad(tolower(h[i]))
			else if (!done) { for (j = c; j < 8; j++) out = out "0000"; done = 1 }
		}
		return out
	}
	{ split($2, p, "/"); l = p[2] / 4; a = expand($1); exit !(length(a) == 32 && substr(a, 1, l) == substr(expand(p[1]), 1, l)) }'
}

# _e2e_addr6 IF PREFIX: prints IF's first usable (not tentative) address in
# PREFIX.
_e2e_addr6() {
	for _a6 in $(ip -6 -o addr show dev "$1" | grep -vE 'tentative|dadfailed' | awk '$3 == "inet6" {sub(/\/.*/, "", $4); print $4}'); do
		if _e2e_in6 "$_a6" "$2"; then echo "$_a6"; return 0; fi
	done
	return 1
}

# e2e_slaac IF PREFIX SECONDS: wait (polling) until IF has an address in
# PREFIX that passed duplicate address detection (SLAAC), report it as
# IF.ip6 and IF's IPv6 default route as IF.route6; abort if none comes.
e2e_slaac() {
	if e2e_wait "$3" _e2e_addr6 "$1" "$2"; then
		e2e_report "$1.ip6" "$(_e2e_addr6 "$1" "$2")"
		e2e_report "$1.route6" "$(ip -6 route show dev "$1" | grep '^default' | head -n1)"
	else
		e2e_report "$1.ip6" none
		ip -6 addr show dev "$1" | sed 's/^/ip6: /'
		e2e_fail "no IPv6 address in $2 on $1 within $3 s"
	fi
}

# e2e_tcp ADDR PORT [KEY]: connect and close.
e2e_tcp() {
	if timeout 10 nc -w 3 "$1" "$2" -e /bin/true >/dev/null 2>&1; then
		e2e_report "${3:-tcp.$1:$2}" ok
	else
		e2e_report "${3:-tcp.$1:$2}" fail
	fi
}

# e2e_echo ADDR PORT PAYLOAD SECONDS [KEY]: send PAYLOAD, expect it back;
# retries until SECONDS pass (the server may still be starting).
e2e_echo() {
	_k="${5:-echo.$1:$2}"
	_n=$(($4 * 2))
	while :; do
		_r=$(echo "$3" | timeout 5 nc -w 3 "$1" "$2" 2>/dev/null)
		if [ "$_r" = "$3" ]; then e2e_report "$_k" ok; return 0; fi
		_n=$((_n - 1))
		if [ "$_n" -le 0 ]; then e2e_report "$_k" fail; e2e_report "$_k.reply" "$_r"; return 1; fi
		sleep 0.5
	done
}

# e2e_listen PORT: background echo server (busybox nc -ll -e); each connection
# is logged to /tmp/nc.PORT.data and counted in /tmp/nc.PORT.conns.
e2e_listen() {
	printf '#!/bin/sh\ntee -a /tmp/nc.%s.data\necho x >>/tmp/nc.%s.conns\n' "$1" "$1" >"/tmp/echo.$1.sh"
	chmod +x "/tmp/echo.$1.sh"
	nc -ll -p "$1" -e "/tmp/echo.$1.sh" </dev/null >/dev/null 2>&1 &
	if e2e_wait 10 sh -c "netstat -ltn | grep -q ':$1 '"; then
		e2e_report "listen.$1" up
	else
		e2e_report "listen.$1" fail
	fi
}

_e2e_served() {
	[ "$(cat /tmp/nc.$1.conns 2>/dev/null | wc -l)" -ge "$2" ] || return 1
	! netstat -tn | grep ":$1 " | grep -vqE 'LISTEN|TIME_WAIT|FIN_WAIT2'
}

# e2e_await_conns PORT N SECONDS: wait until the echo server on PORT has
# served N connections completely (peer acknowledged everything).
e2e_await_conns() {
	if e2e_wait "$3" _e2e_served "$1" "$2"; then
		e2e_report "listen.$1.conns" "$(cat /tmp/nc.$1.conns | wc -l)"
	else
		e2e_report "listen.$1.conns" "$(cat /tmp/nc.$1.conns 2>/dev/null | wc -l) (wanted $2)"
	fi
	e2e_report "listen.$1.data" "$(cat /tmp/nc.$1.data 2>/dev/null | tr '\n' ' ' | sed 's/ $//')"
}
`

// udhcpcScript is the udhcpc event script: it configures the address,
// default route and MTU, writes /etc/resolv.conf and saves the lease to
// /tmp/dhcp.$interface for e2e_dhcp to report.
const udhcpcScript = `#!/bin/sh
case "$1" in
deconfig)
	ip -4 addr flush dev "$interface"
	ip link set "$interface" up
	;;
bound|renew)
	prefix="$mask"
	[ -n "$prefix" ] || prefix=$(ipcalc -p "$ip" "$subnet" | cut -d= -f2)
	ip -4 addr flush dev "$interface"
	[ -z "$mtu" ] || ip link set "$interface" mtu "$mtu"
	ip addr add "$ip/$prefix" dev "$interface"
	for r in $router; do
		ip route replace default via "$r" dev "$interface"
		break
	done
	: >/etc/resolv.conf
	[ -z "$domain" ] || echo "search $domain" >>/etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	{
		echo "ip='$ip'"
		echo "prefix='$prefix'"
		echo "router='$router'"
		echo "dns='$dns'"
		echo "domain='$domain'"
		echo "mtu='$mtu'"
		echo "lease='$lease'"
		echo "serverid='$serverid'"
	} >"/tmp/dhcp.$interface"
	;;
esac
exit 0
`
