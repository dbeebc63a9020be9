// Package spectest has the networks.yaml and VM files that the tests of
// spec and of its users share.
package spectest

import (
	"github.com/vmnetctl/vmnetctl/statedir"
)

// Networks define shared, host and an unused network.
const Networks = `
vmnet:
  shared:
    subnet: 192.168.105.0/24
  host:
    mode: host
    subnet: 192.168.106.0/24
  unused:
    subnet: 192.168.120.0/24
`

// Project is a project of one VM file, vms.
func Project(name, vms string) *statedir.Project {
	return &statedir.Project{Name: name, Files: []statedir.ProjectFile{{Path: name + ".yaml", Data: []byte(vms)}}}
}

// VMs are web (on shared and host) and db (on shared, at a fixed address).
const VMs = `
vms:
  web:
    networks:
      - vmnet: shared
      - vmnet: host
  db:
    networks:
      - vmnet: shared
        ip: 192.168.105.20
`
