package agentloop

import (
	"encoding/json"
	"fmt"
	"strings"

	"corral.dev/corral/controlplane/model"
	"corral.dev/corral/internal/textcut"
)

// maxServerResultText bounds the text an agent.tool_result of a server
// tool shows of the provider's result (the model gets the whole block).
const maxServerResultText = 16 << 10

// privateBlock keeps b for the model as it came, cleaned only where the
// event log could not store it (text that is not UTF-8 or holds NUL: no
// model writes such, and a block so changed fails the provider's checks
// rather than the log's).
func privateBlock(b model.Block) *Private {
	b.Thinking, b.Signature, b.Data = storableText(b.Thinking), storableText(b.Signature), storableText(b.Data)
	b.ID, b.Name, b.ToolUseID = storableText(b.ID), storableText(b.Name), storableText(b.ToolUseID)
	if len(b.Input) > 0 && CheckStorable(b.Input) != nil {
		b.Input = storableJSON(b.Input)
	}
	if len(b.Raw) > 0 && CheckStorable(b.Raw) != nil {
		b.Raw = storableJSON(b.Raw)
	}
	return &Private{Blocks: []model.Block{b}}
}

// serverResultContent is what an agent.tool_result shows of a server
// tool's result block: each search result's title and URL, or a fetched
// page's URL and text (bounded), or the provider's error code.
func serverResultContent(b model.Block) ([]model.Block, bool) {
	var block struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b.Raw, &block); err != nil {
		return textBlocks("the provider's result could not be read"), true
	}
	type item struct {
		Type      string `json:"type"`
		URL       string `json:"url"`
		Title     string `json:"title"`
		ErrorCode string `json:"error_code"`
		Content   *struct {
			Title  string `json:"title"`
			Source struct {
				Data string `json:"data"`
			} `json:"source"`
		} `json:"content"`
	}
	var items []item
	if err := json.Unmarshal(block.Content, &items); err != nil {
		var one item
		if err := json.Unmarshal(block.Content, &one); err != nil {
			return textBlocks("the provider's result could not be read"), true
		}
		items = []item{one}
	}
	var sb strings.Builder
	isError := false
	for _, it := range items {
		switch {
		case strings.HasSuffix(it.Type, "_error"):
			isError = true
			fmt.Fprintf(&sb, "%s failed: %s\n", strings.TrimSuffix(b.Type, "_tool_result"), it.ErrorCode)
		case it.Type == "web_fetch_result":
			sb.WriteString(it.URL + "\n")
			if it.Content != nil {
				if it.Content.Title != "" {
					sb.WriteString(it.Content.Title + "\n")
				}
				sb.WriteString(it.Content.Source.Data + "\n")
			}
		default:
			fmt.Fprintf(&sb, "%s\n%s\n", it.Title, it.URL)
		}
		if sb.Len() > maxServerResultText {
			break
		}
	}
	text := storableText(textcut.Prefix(strings.TrimSuffix(sb.String(), "\n"), maxServerResultText))
	if text == "" {
		text = "no results"
	}
	return textBlocks(text), isError
}
