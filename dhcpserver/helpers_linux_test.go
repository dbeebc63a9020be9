package dhcpserver

import (
	"time"

	"github.com/vmnetctl/vmnetctl/test/testutil"
)

// testNet and mustMAC are the fixtures of testutil.
var (
	testNet = testutil.Network
	mustMAC = testutil.MAC
)

// guardNow is the injected clock of the server's tests.
var guardNow = time.Unix(1_800_000_000, 0)
