// Package bench measures `vmnetctl helper`'s throughput against a plain veth
// pair, slirp4netns and gvproxy in network namespaces. See README.md; it runs
// only when asked:
//
//	sudo VMNETCTL_BENCH=1 go test ./bench -run Throughput -v
package bench
