package hostnet

// TablePrefix starts the name of each network's nftables table.
const TablePrefix = "vmnetctl-"

// TableName is the nftables table (family inet) of network id.
func TableName(id string) string { return TablePrefix + id }
