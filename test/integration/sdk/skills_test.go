package sdk

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"corral.dev/corral/controlplane/fleet/admission"
	"corral.dev/corral/controlplane/server"
	"corral.dev/corral/controlplane/server/servertest"
	"corral.dev/corral/controlplane/store/pgtest"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/hostagent/driver/containerd/containerdtest"
)

// A skill through the SDK against a node with a gVisor host: uploaded,
// attached to an agent (a missing one is refused), offered to the model in
// its system prompt with its path, and staged read-only in the session's
// sandbox, where bash reads its SKILL.md and cannot write it.
func TestSkillsThroughTheSDK(t *testing.T) {
	containerdtest.Address(t) // skips (fails under CI) without the runtime
	srv := servertest.Start(t, pgtest.New(t), server.Config{NodeID: "sdk-skills", SandboxRuntime: admission.RuntimeGVisor})
	startGVisorHost(t, srv, "gvisor-skills")
	c := anthropic.NewClient(option.WithBaseURL("http://"+srv.HTTPAddr()), option.WithAPIKey(servertest.TenantKey(t, srv, tenant.Default)),
		option.WithRequestTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	const md = "---\nname: csv-report\ndescription: Summarises CSV files into a report.\n---\n# CSV report\nRun scripts/report.sh FILE.\n"
	sk, err := c.Beta.Skills.New(ctx, anthropic.BetaSkillNewParams{
		DisplayName: anthropic.String("CSV report"),
		Files: []io.Reader{
			anthropic.File(strings.NewReader(md), "csv-report/SKILL.md", "text/markdown"),
			anthropic.File(strings.NewReader("#!/bin/sh\nwc -l \"$1\"\n"), "csv-report/scripts/report.sh", "text/x-shellscript"),
		},
	})
	if err != nil {
		t.Fatalf("Skills.New: %v", err)
	}
	decodedCleanly(t, "Skills.New", sk)
	v, err := c.Beta.Skills.Versions.Get(ctx, sk.LatestVersionID, anthropic.BetaSkillVersionGetParams{SkillID: sk.ID})
	if err != nil || v.Name != "csv-report" || v.Description != "Summarises CSV files into a report." {
		t.Fatalf("Skills.Versions.Get: %+v, %v", v, err)
	}
	decodedCleanly(t, "Skills.Versions.Get", v)
	if l, err := c.Beta.Skills.List(ctx, anthropic.BetaSkillListParams{}); err != nil || len(l.Data) != 1 || l.Data[0].ID != sk.ID {
		t.Fatalf("Skills.List: %+v, %v", l, err)
	}
	// A bundle without SKILL.md is a 400.
	if _, err := c.Beta.Skills.New(ctx, anthropic.BetaSkillNewParams{Files: []io.Reader{anthropic.File(strings.NewReader("x"), "s/README.md", "text/plain")}}); err == nil {
		t.Fatal("a bundle without SKILL.md was taken")
	} else if st, msg := apiStatus(err); st != http.StatusBadRequest || !strings.Contains(msg, "SKILL.md") {
		t.Fatalf("no SKILL.md: %d %s", st, msg)
	}

	tools := []anthropic.BetaAgentNewParamsToolUnion{{OfAgentToolset20260401: &anthropic.BetaManagedAgentsAgentToolset20260401Params{}}}
	model := anthropic.BetaManagedAgentsModelConfigParams{ID: "fake"}
	// A skill that does not exist is refused.
	if _, err := c.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "missing", Model: model, Tools: tools,
		Skills: []anthropic.BetaManagedAgentsSkillParamsUnion{{OfCustom: &anthropic.BetaManagedAgentsCustomSkillParams{SkillID: "skill_missing"}}}}); err == nil {
		t.Fatal("an agent with a missing skill was created")
	} else if st, msg := apiStatus(err); st != http.StatusBadRequest || !strings.Contains(msg, "skill_missing") {
		t.Fatalf("missing skill: %d %s", st, msg)
	}
	ag, err := c.Beta.Agents.New(ctx, anthropic.BetaAgentNewParams{Name: "skills", Model: model, Tools: tools, System: anthropic.String("Be brief."),
		Skills: []anthropic.BetaManagedAgentsSkillParamsUnion{{OfCustom: &anthropic.BetaManagedAgentsCustomSkillParams{SkillID: sk.ID}}}})
	if err != nil {
		t.Fatalf("Agents.New with a skill: %v", err)
	}
	if len(ag.Skills) != 1 || ag.Skills[0].SkillID != sk.ID || ag.Skills[0].Version != sk.LatestVersionID {
		t.Fatalf("the agent's skills: %s", ag.JSON.Skills.Raw())
	}
	env, err := c.Beta.Environments.New(ctx, anthropic.BetaEnvironmentNewParams{Name: "skills"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Beta.Sessions.New(ctx, anthropic.BetaSessionNewParams{Agent: anthropic.BetaSessionNewParamsAgentUnion{OfString: anthropic.String(ag.ID)}, EnvironmentID: env.ID})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Beta.Sessions.Events.StreamEvents(ctx, sess.ID, anthropic.BetaSessionEventStreamParams{})
	defer s.Close()

	// The model is told of the skill: the fake answers with its system
	// prompt.
	if _, err := c.Beta.Sessions.Events.Send(ctx, sess.ID, anthropic.BetaSessionEventSendParams{Events: []anthropic.BetaManagedAgentsEventParamsUnion{say("!system")}}); err != nil {
		t.Fatal(err)
	}
	var system string
	for _, e := range untilIdle(t, s) {
		if e.Type == "agent.message" {
			for _, b := range e.AsAgentMessage().Content {
				system += b.Text
			}
		}
	}
	const skillMD = "/mnt/session/uploads/.skills/csv-report/SKILL.md"
	for _, want := range []string{"Be brief.", "<name>csv-report</name>", "<description>Summarises CSV files into a report.</description>", "<location>" + skillMD + "</location>"} {
		if !strings.Contains(system, want) {
			t.Errorf("the system prompt lacks %q: %q", want, system)
		}
	}

	start := time.Now()
	out := bashTurn(t, ctx, c, sess.ID, s, "cat "+skillMD+" && sh /mnt/session/uploads/.skills/csv-report/scripts/report.sh "+skillMD)
	t.Logf("first tool call (a cold gVisor sandbox, the skill staged) in %v", time.Since(start))
	if !strings.Contains(out, "# CSV report") || !strings.Contains(out, "6 "+skillMD) {
		t.Fatalf("reading the skill in the sandbox: %q", out)
	}
	out = bashTurn(t, ctx, c, sess.ID, s, `(echo x >> `+skillMD+` && echo WROTE) || echo REFUSED-write
(rm -f `+skillMD+` && test ! -e `+skillMD+` && echo REMOVED) || echo REFUSED-rm
(touch /mnt/session/uploads/.skills/csv-report/new && echo ADDED) || echo REFUSED-add
head -2 `+skillMD)
	for _, want := range []string{"REFUSED-write", "REFUSED-rm", "REFUSED-add", "name: csv-report"} {
		if !strings.Contains(out, want) {
			t.Errorf("the skill is not read-only: %q lacks %s", out, want)
		}
	}

	// The download is the bundle, a zip under the skill's name.
	resp, err := c.Beta.Skills.Versions.Download(ctx, sk.LatestVersionID, anthropic.BetaSkillVersionDownloadParams{SkillID: sk.ID})
	if err != nil {
		t.Fatalf("Skills.Versions.Download: %v", err)
	}
	zipped, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if len(zipped) < 4 || string(zipped[:2]) != "PK" {
		t.Fatalf("the download is not a zip: %q", zipped[:min(len(zipped), 16)])
	}
	if d, err := c.Beta.Skills.Delete(ctx, sk.ID, anthropic.BetaSkillDeleteParams{}); err != nil || d.ID != sk.ID {
		t.Fatalf("Skills.Delete: %+v, %v", d, err)
	}
}
