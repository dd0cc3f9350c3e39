"""The streaming side: the streamer and its capture strategies (table passes, WAL passes), the stream locks and
positions they share, how a streamer waits, retention, and switching capture modes. It imports nothing of the
consuming side (an import contract)."""
