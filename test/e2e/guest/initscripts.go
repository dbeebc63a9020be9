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

# e2e_resolve NAME SERVER [KEY]: reports the addresses, comma separated, or fail.
e2e_resolve() {
	_out=$(timeout 20 nslookup "$1" "$2" 2>&1)
	_addrs=$(echo "$_out" | awk '/^Name:/ {f=1; next} f && /^Address/ {sub(/^Address[ 0-9]*:[ \t]*/, ""); print}' | tr '\n' ',' | sed 's/,$//')
	if [ -n "$_addrs" ]; then
		e2e_report "${3:-dns.$1}" "$_addrs"
	else
		echo "$_out" | sed 's/^/nslookup: /'
		e2e_report "${3:-dns.$1}" fail
	fi
}

# e2e_resolve_within NAME SERVER SECONDS [KEY]: e2e_resolve, retried every
# 0.5 s until the name resolves or SECONDS pass (another guest may not have
# its lease yet).
e2e_resolve_within() {
	_n=$(($3 * 2))
	while :; do
		_out=$(timeout 10 nslookup "$1" "$2" 2>&1)
		_addrs=$(echo "$_out" | awk '/^Name:/ {f=1; next} f && /^Address/ {sub(/^Address[ 0-9]*:[ \t]*/, ""); print}' | tr '\n' ',' | sed 's/,$//')
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
