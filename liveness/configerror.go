// ConfigError: a configuration value the package refuses, named by its field. How every
// error of the package reads: doc.go, # Errors.

package liveness

// ConfigError is a configuration value the library refuses. Field names the config
// field ("AgentConfig.Timing.StaleThreshold", "ReaderConfig.Whizbang.Prefix"), never a
// flag: a binary maps fields to its flags.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "liveness: " + e.Field + " " + e.Reason }
