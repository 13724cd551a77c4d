// The e2e tests' own image, built by the tests for amd64 and arm64 (CGO_ENABLED=0, static):
//
//	tiny          prints "arch=<GOARCH>" and sleeps until told to stop (a workload)
//	tiny pause    sleeps until told to stop (the real node's pod sandbox image)
package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "pause" {
		fmt.Printf("arch=%s\n", runtime.GOARCH)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
