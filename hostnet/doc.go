// Package hostnet is what the data plane's parts share about the host's
// network stack: the marks that tell which links and tables are
// vmnetctl's (whose network, which state dir), making a link
// crash-safely under a temporary name, and reading links, addresses and
// forwarding entries through the kernel's interrupted dumps.
package hostnet
