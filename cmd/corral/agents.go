package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// agent is the part of an agent object the table shows.
type agentView struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Version     int64  `json:"version"`
	Description string `json:"description"`
	System      string `json:"system"`
	Model       struct {
		ID string `json:"id"`
	} `json:"model"`
	Tools []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tools"`
	MCPServers []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	} `json:"mcp_servers"`
	Metadata   map[string]string `json:"metadata"`
	CreatedAt  string            `json:"created_at"`
	UpdatedAt  string            `json:"updated_at"`
	ArchivedAt *string           `json:"archived_at"`
}

func (a agentView) tools() string {
	var names []string
	for _, t := range a.Tools {
		names = append(names, orDash(cmp.Or(t.Name, t.Type)))
	}
	return orDash(strings.Join(names, ","))
}

func agentsCommand() *cobra.Command {
	var r restConn
	cmd := &cobra.Command{Use: "agents", Short: "List and show agents (REST API; a tenant key)"}
	r.register(cmd)

	var limit int
	var archived bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List agents, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			q := url.Values{}
			if archived {
				q.Set("include_archived", "true")
			}
			items, err := r.list(ctx, "/v1/agents", q, limit, 100)
			if err != nil {
				return fmt.Errorf("listing agents: %w", err)
			}
			if r.output == "json" {
				return writeJSON(cmd.OutOrStdout(), items)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tNAME\tVERSION\tMODEL\tTOOLS\tCREATED")
			for _, raw := range items {
				var a agentView
				if err := json.Unmarshal(raw, &a); err != nil {
					return fmt.Errorf("listing agents: %w", err)
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", a.ID, oneLine(a.Name, 40), a.Version, orDash(a.Model.ID), a.tools(), a.CreatedAt)
			}
			return w.Flush()
		},
	}
	ls.Flags().IntVar(&limit, "limit", 0, "list at most this many (0: all)")
	ls.Flags().BoolVar(&archived, "include-archived", false, "list archived agents too")

	get := &cobra.Command{
		Use:   "get AGENT",
		Short: "Show an agent's latest version",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
			defer cancel()
			b, err := r.do(ctx, http.MethodGet, "/v1/agents/"+url.PathEscape(args[0]), nil)
			if err != nil {
				return fmt.Errorf("agent %s: %w", args[0], err)
			}
			if r.output == "json" {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", bytes.TrimSpace(b))
				return err
			}
			var a agentView
			if err := json.Unmarshal(b, &a); err != nil {
				return fmt.Errorf("agent %s: %w", args[0], err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "ID:\t%s\n", a.ID)
			fmt.Fprintf(w, "Name:\t%s\n", oneLine(a.Name, 200))
			fmt.Fprintf(w, "Version:\t%d\n", a.Version)
			fmt.Fprintf(w, "Model:\t%s\n", orDash(a.Model.ID))
			fmt.Fprintf(w, "Description:\t%s\n", orDash(oneLine(a.Description, 200)))
			fmt.Fprintf(w, "System:\t%s\n", orDash(oneLine(a.System, 200)))
			fmt.Fprintf(w, "Tools:\t%s\n", a.tools())
			for _, m := range a.MCPServers {
				fmt.Fprintf(w, "MCP server:\t%s %s\n", m.Name, m.URL)
			}
			for _, k := range slices.Sorted(maps.Keys(a.Metadata)) {
				fmt.Fprintf(w, "Metadata:\t%s=%s\n", k, oneLine(a.Metadata[k], 200))
			}
			fmt.Fprintf(w, "Created:\t%s\n", a.CreatedAt)
			fmt.Fprintf(w, "Updated:\t%s\n", a.UpdatedAt)
			if a.ArchivedAt != nil {
				fmt.Fprintf(w, "Archived:\t%s\n", *a.ArchivedAt)
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(ls, get)
	return cmd
}
