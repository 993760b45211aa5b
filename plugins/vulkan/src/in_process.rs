//! [`VulkanBackend`] behind the `Backend` trait, in-process (tests and tools): the same backend the plugin table
//! wraps, taking records whose weights are `*const Weight`s it made.

use kazeia_backend_abi::plugin::OpRecord;
use kazeia_backend_abi::{Backend, Capabilities, Weight, WeightData, WeightFormat};

use crate::backend::VulkanBackend;
use crate::weights::VkWeight;

impl Backend for VulkanBackend {
    fn name(&self) -> &str {
        "vulkan"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Capabilities::LISTS)
    }

    fn upload(&self, weight: WeightData<'_>) -> Result<Weight, String> {
        VulkanBackend::upload(self, &weight.desc()).map(Weight::new)
    }

    fn supports(&self, op: &OpRecord) -> bool {
        self.supports_record(op)
    }

    /// The list as the plugin table would take it: consecutive device ops in one submission.
    unsafe fn run_records(&self, ops: &[OpRecord]) -> Result<(), String> {
        let records: Vec<OpRecord> = ops
            .iter()
            .map(|op| {
                let mut record = *op;
                // SAFETY: null or a live `Weight` of this backend (`run_records`'s contract).
                if let Some(w) = unsafe { (op.weight as *const Weight).as_ref() } {
                    let w = w
                        .downcast::<VkWeight>()
                        .ok_or("a weight made by another backend")?;
                    record.weight = w as *const VkWeight as *const std::ffi::c_void;
                }
                Ok(record)
            })
            .collect::<Result<_, String>>()?;
        // SAFETY: the same buffers as `ops` (valid by this method's contract), each weight now this backend's
        // `VkWeight`.
        unsafe { VulkanBackend::run_records(self, &records) }
    }

    fn export_linear(&self, w: &Weight) -> Option<Vec<u8>> {
        VulkanBackend::export_linear(self, w.downcast::<VkWeight>()?)
    }

    fn import_linear(
        &self,
        bytes: &[u8],
        out: usize,
        inp: usize,
        format: WeightFormat,
    ) -> Option<Weight> {
        VulkanBackend::import_linear(self, bytes, out, inp, format).map(Weight::new)
    }
}
