"""The torchkit library, by floor: io, runtime, data, models, inference, then one module or
package per command. No CLI code, no printing."""
