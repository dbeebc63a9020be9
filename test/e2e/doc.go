// Package e2e holds vmnetctl's end-to-end tests with real QEMU guests. The
// reusable harness (guest image, check scripts, qemu runner, namespace
// helpers) is in package guest; see docs/e2e.md.
package e2e
