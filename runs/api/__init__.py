"""The JSON API (docs/api.md): base (the frame and shared schemas), runs (the run and event
endpoints), auth, errors, middleware, schema refinements, docs page, and the API client model.
The people's endpoints are approvals.api; taskpilots.api assembles both."""
