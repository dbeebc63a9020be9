package ctlapi

// CaptureTrailer is the trailer of GET /v1/capture, after the pcapng
// stream: "frames=N dropped=M", and "; ERROR" if the capture failed once
// it had begun.
const CaptureTrailer = "Vmnetctl-Capture"
