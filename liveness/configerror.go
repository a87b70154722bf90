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

// Error names the field and says what is wrong with its value, never the value of a
// secret.
func (e *ConfigError) Error() string { return "liveness: " + e.Field + " " + e.Reason }
