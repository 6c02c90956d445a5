-- A session's budget (the Managed Agents API's budget.max_list_cost), in
-- US cents; NULL: none. Its list cost is its tokens at the policy's model
-- prices (policy/prices.yaml), so nothing else is stored: a turn ends with
-- budget_reached once that cost reaches the budget.

-- +goose Up
ALTER TABLE sessions ADD COLUMN budget_cents bigint CHECK (budget_cents > 0);

-- +goose Down
ALTER TABLE sessions DROP COLUMN budget_cents;
