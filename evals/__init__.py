"""The evaluation harness: whole trajectories through the real pipeline, scored per case.

Each case runs through Redis, the queue, a real RQ worker and the approval flow; the case
says how its approvals are decided and what counts as success. Scripted model turns make
the suite run offline; the same cases run against a configured model.

- `cases`: the cases file (eval/README.md describes it);
- `harness`: one case through the pipeline, and its score;
- `report`: the results as JSON and as a table;
- `scripted`: the scripted model, and how a turn is chosen (shared with the tests' fake
  OpenAI server).

This package uses worker/, tools/ and approvals/; none of them imports it.
"""
