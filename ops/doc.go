// Package ops carries out the CLI's commands (up, down, plan, run, status,
// describe, logs, ...): it reads the user's files, records projects, and
// talks to the controller over its socket, or reads the state dir when no
// controller runs.
package ops
