// Command k6 is k6 v1.8.1 with hl7gw's k6/x/mllp extension compiled in (built by scripts/k6.sh build; no xk6).
package main

import (
	"go.k6.io/k6/cmd"

	_ "hl7gw.local/loadtest/k6/mllp" // registers k6/x/mllp
)

func main() {
	cmd.Execute()
}
