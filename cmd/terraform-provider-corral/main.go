// Command terraform-provider-corral is corral's Terraform provider, served
// to the terraform CLI over the plugin protocol (v6). The provider itself
// is deploy/terraform/provider; this is its wiring.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"

	"corral.dev/corral/deploy/terraform/provider"
	"corral.dev/corral/internal/version"
)

func main() {
	var debug bool
	flag.BoolVar(&debug, "debug", false, "run for a debugger: print the TF_REATTACH_PROVIDERS value to use")
	flag.Parse()
	err := providerserver.Serve(context.Background(), provider.New(version.String()), providerserver.ServeOpts{
		Address: provider.Address,
		Debug:   debug,
	})
	if err != nil {
		log.Fatal(err)
	}
}
