"""The engine and its parts, below every face: one model room (admission, queue, workers,
the model thread), live sessions, and the contract's requests and results (convert, rows)."""
