"""The dashboard (`/dashboard`): queues, jobs, the dead letter, workers, schedules and the
database's health, as server-rendered pages for a person, refreshed live by a small script.

`jobq.dashboard.session`: who may look (the admin token: a login form and a session cookie,
or `Authorization: Bearer`) and the CSRF protection of its actions. `jobq.dashboard.views`: the
frame and the overview (with its charts' data, `jobq.queue.history`); `jobq.dashboard.lists`:
the job search and the dead letter with their actions, over the engine's verbs
(`jobq.queue.store`, `control`, `dead`, `schedule`); `jobq.dashboard.workflows` and `graph`:
the workflows' pages and graphs; `jobq.dashboard.blueprint`: the blueprint with all their
routes, which the app registers. `jobq.dashboard.format`: the numbers and times as people read
them.

The package itself imports nothing, so that the CLI can format with `format` without Quart.
"""
