"""Sending a task to its target: dispatch and fairness, flow keys, breakers, rate limits, the retry decision and backoff, the request built for an attempt, the HTTP client and the target guard."""
