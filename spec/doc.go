// Package spec is the desired state, computed alike on both sides of the
// controller's socket: the attachments and networks that the recorded
// projects ask for, and the plan between two such states.
package spec
