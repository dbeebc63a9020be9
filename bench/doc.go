// Package bench measures `vmnetctl helper`'s throughput against a plain veth
// pair, slirp4netns and gvproxy in network namespaces, and checks that every
// path moved data and that the helpers' counters agree with iperf3. See
// README.md; it runs only when asked, in full or as the short smoke run CI
// makes:
//
//	sudo VMNETCTL_BENCH=1 go test ./bench -run Throughput -v
//	sudo CI=true VMNETCTL_BENCH=smoke go test ./bench -run '^TestThroughput$'
package bench
