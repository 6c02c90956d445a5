package api

import (
	"context"

	"corral.dev/corral/controlplane/api/console"
	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/internal/logging"
)

// consoleSignIn is the console's sign-in port over the authenticator: the
// console reaches authentication only through it.
type consoleSignIn struct{ a *auth.Authenticator }

var _ console.SignIn = consoleSignIn{}

func (c consoleSignIn) Providers() []console.Provider {
	var out []console.Provider
	for _, ic := range c.a.ConsoleIssuers() {
		out = append(out, console.Provider{Issuer: ic.Issuer, ClientID: ic.ConsoleClientID, Scopes: ic.Scopes(), Name: ic.ConsoleLabel()})
	}
	return out
}

func (c consoleSignIn) Endpoints(ctx context.Context, iss string) (console.Endpoints, error) {
	e, err := c.a.Endpoints(ctx, iss)
	return console.Endpoints{Authorization: e.Authorization, Token: e.Token}, err
}

// Verify authenticates token as the API's middleware does a bearer
// credential.
func (c consoleSignIn) Verify(ctx context.Context, token string) error {
	_, err := c.a.Authenticate(ctx, auth.Credentials{Bearer: logging.Secret(token)})
	return err
}
