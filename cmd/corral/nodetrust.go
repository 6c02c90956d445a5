package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"corral.dev/corral/controlplane/raftfsm"
	"corral.dev/corral/internal/logging"
	"corral.dev/corral/internal/seal"
)

// nodeTokenEnv is where a joining node's token is read from (a flag shows
// in process listings).
const nodeTokenEnv = "CORRAL_NODE_JOIN_TOKEN"

// nodeTrustFlags adds the seal key and node join token flags to the server
// command.
func nodeTrustFlags(cmd *cobra.Command, sealKeyFile *string, token *logging.Secret) {
	f := cmd.Flags()
	f.StringVar(sealKeyFile, "seal-key-file", os.Getenv("CORRAL_SEAL_KEY_FILE"),
		"seal keyring shared by every node (secrets in Raft are sealed with it); default <data-dir>/seal.key, generated on a bootstrap node's first start")
	var tok string
	f.StringVar(&tok, "node-join-token", "", "first start of a joining node: the one-time token from `corral admin node-token` (prefer $"+nodeTokenEnv+"; flags show in ps)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		*token = logging.Secret(firstSet(tok, os.Getenv(nodeTokenEnv)))
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

func firstSet(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// localNode is how the node commands reach a node: run on that node, with
// its data directory (its certificate) and its seal key.
type localNode struct {
	dataDir, addr, sealKeyFile string
}

func (l *localNode) flags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&l.dataDir, "data-dir", envOr("CORRAL_DATA_DIR", ".corral/server"), "data directory of the node this runs on (its node certificate)")
	f.StringVar(&l.addr, "raft-http-addr", "127.0.0.1:8301", "that node's --raft-http-addr")
	f.StringVar(&l.sealKeyFile, "seal-key-file", os.Getenv("CORRAL_SEAL_KEY_FILE"), "that node's seal key file (default <data-dir>/seal.key)")
}

func (l *localNode) client() (*raftfsm.Client, error) {
	ring, err := seal.Load(firstSet(l.sealKeyFile, filepath.Join(l.dataDir, "seal.key")))
	if err != nil {
		return nil, err
	}
	return raftfsm.NewClient(l.dataDir, ring, l.addr)
}

// nodeTokenCommand mints a one-time join token for a new control-plane
// node, as `corral hosts token` does for hosts. It authenticates with the
// node certificate of the node it runs on.
func nodeTokenCommand() *cobra.Command {
	var l localNode
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "node-token",
		Short: "Issue a one-time join token for a new control-plane node (corral server --join ADDR, token in $" + nodeTokenEnv + "); run it on a member",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := l.client()
			if err != nil {
				return err
			}
			tok, err := c.IssueNodeToken(cmd.Context(), ttl)
			if err != nil {
				return fmt.Errorf("issuing a node join token at %s: %w", l.addr, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	l.flags(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token may be used")
	return cmd
}

// sealCommand manages the seal keyring and reseals the cluster's secrets.
func sealCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "seal", Short: "Manage the seal key that encrypts the secrets in Raft (see README: rotating the seal key)"}
	var file string
	newKey := &cobra.Command{
		Use:   "new-key",
		Short: "Put a fresh key first in a seal key file (the old keys stay below it, to open what they sealed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("--seal-key-file is required")
			}
			id, err := seal.AddKey(file)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "seal key %s is first in %s: copy the file to every node, then run `corral admin seal rotate`\n", id, file)
			return nil
		},
	}
	newKey.Flags().StringVar(&file, "seal-key-file", os.Getenv("CORRAL_SEAL_KEY_FILE"), "the seal key file")
	var l localNode
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Reseal every secret in Raft under the first key of the node's seal key file (every node must hold that key first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := l.client()
			if err != nil {
				return err
			}
			res, err := c.RotateSeal(cmd.Context())
			if err != nil {
				return fmt.Errorf("rotating the seal key at %s: %w", l.addr, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d secrets resealed under key %s\n", res.Resealed, res.KeyID)
			return nil
		},
	}
	l.flags(rotate)
	cmd.AddCommand(newKey, rotate)
	return cmd
}
