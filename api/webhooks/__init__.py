"""Signed webhooks: subscriptions, the outbox of deliveries, messages and where they may go.

- `subscriptions`: who wants which events (admin API), and whether an event matches.
- `outbox`: a delivery row per (subscription, event), written in the event's own transaction
  and enqueued after commit; the delivery state machine (claim, record, back off, sweep).
- `messages`: the JSON body (Standard Webhooks or Slack) and its signature headers.
- `targets`: which URLs are allowed (no loopback, private or link-local addresses unless
  configured) and the HTTP POST itself, pinned to the address that was checked.

The Celery tasks that deliver and sweep live in `workers/tasks/webhooks.py`.
"""
