// Package logging holds what every logger of this module passes through, and what the
// liveness library, the binaries and the exporter's views share for their log lines:
//
//   - Redacting (and Wrap), a slog.Handler that takes every password out of every record
//     (the message, strings, errors, groups, attributes added with With, and any value
//     whose printed form holds one), so that no log line has to remember to;
//   - Redact and RedactError, the same removal for text and errors that are printed
//     elsewhere (a flag error, a status page's error line). A pgx error that quotes a
//     DSN it could not parse becomes a fixed description of what is wrong, since where
//     the password of a malformed DSN ends is exactly what it leaves unclear;
//   - Repeats, which turns a condition met again and again (a failure retried on every
//     tick, a state seen on every scrape) into one line when it begins or changes and
//     one when it ends.
//
// Loggers are wrapped where they are built (the binaries) and where a caller's logger
// enters a library (liveness, collector); parts that receive a logger from their owner
// use it as it is.
//
// It guarantees that a record passed through Redacting, and a text or an error passed
// through Redact or RedactError, holds no password of a keyword/value DSN, a URL or a
// URL's query parameters. It must never print, keep or return what it removes, and it
// imports nothing of this module: the public liveness library depends on it.
package logging
