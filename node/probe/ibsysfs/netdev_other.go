//go:build !linux

package ibsysfs

import "errors"

// LiveNetDevMapper is unavailable off Linux: RDMA devices live in Linux sysfs.
type LiveNetDevMapper struct{}

// NewLiveNetDevMapper returns a mapper that maps nothing.
func NewLiveNetDevMapper() *LiveNetDevMapper { return &LiveNetDevMapper{} }

// NetDevice always fails off Linux.
func (*LiveNetDevMapper) NetDevice(string) (string, error) {
	return "", errors.New("rdma net device mapping is only available on linux")
}
