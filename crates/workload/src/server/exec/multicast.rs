//! The multicast commands (`mc-*`), for the fake-driver tests of the interposer's multicast
//! support. Multicast must never run on a real GPU of this project (docs/design.md, GPU rules), so
//! every command passes [`Exec::fake_only`] before anything else: on any driver but the bundled
//! fake (told by a symbol only it exports, [`Driver::is_bundled_fake`]) it is refused and nothing
//! is called.
//! `tests/no_multicast_on_gpu.rs` (fake-cuda) checks that every function of this file that names
//! a multicast entry point calls the gate first, and that nothing outside this file names one.
//!
//! [`Driver::is_bundled_fake`]: crate::driver::Driver::is_bundled_fake

use cuda::DriverHandle;
use cuda_abi::CUmulticastObjectProp;

use super::{Exec, Fail, Handle, Outcome, handle_types_opt, state};
use crate::grammar::{Args, parse_number};
use crate::reply::Reply;

impl Exec<'_> {
    /// The gate: refuses `command` unless the driver is the bundled fake.
    fn fake_only(&self, command: &str) -> Result<(), Fail> {
        if self.driver.is_bundled_fake() {
            Ok(())
        } else {
            Err(state(format!(
                "{command}: multicast runs on the bundled fake driver only, and {} is not it",
                self.driver.path().display()
            )))
        }
    }

    /// `mc-create NAME SIZE --devices N [--handle-types T]`: `cuMulticastCreate`.
    pub(super) fn mc_create(&mut self, a: &Args) -> Outcome {
        self.fake_only("mc-create")?;
        a.check(2, &["devices", "handle-types"])?;
        let name = a.pos(0, "name")?;
        self.new_handle_name(name)?;
        let size = parse_number(a.pos(1, "size")?)?;
        let devices = a
            .num_opt("devices")?
            .ok_or_else(|| Fail::Usage("mc-create needs --devices".into()))?;
        let prop = CUmulticastObjectProp {
            numDevices: u32::try_from(devices).map_err(|_| Fail::Usage("--devices".into()))?,
            size: size as usize,
            handleTypes: handle_types_opt(a)?.into(),
            flags: 0,
        };
        let h = self.driver.api().multicast_create(&prop)?.raw();
        self.handles.insert(
            name.to_owned(),
            Handle {
                value: h,
                size: Some(size),
                origin: "multicast",
            },
        );
        Ok(Reply::ok("mc-create")
            .with("name", name)
            .with("handle", h)
            .with("size", size))
    }

    /// `mc-add-device MC [--device D]`: `cuMulticastAddDevice` (default: the workload's device).
    pub(super) fn mc_add_device(&mut self, a: &Args) -> Outcome {
        self.fake_only("mc-add-device")?;
        a.check(1, &["device"])?;
        let mc = DriverHandle::from_raw(self.handle(a.pos(0, "multicast object")?)?);
        let device = self.device_opt(a)?;
        self.driver
            .api()
            .multicast_add_device(mc, self.driver.device(device)?)?;
        Ok(Reply::ok("mc-add-device").with("device", device))
    }

    /// `mc-bind-mem MC MC_OFFSET HANDLE --size S [--mem-offset O]`: `cuMulticastBindMem`.
    pub(super) fn mc_bind_mem(&mut self, a: &Args) -> Outcome {
        self.fake_only("mc-bind-mem")?;
        a.check(3, &["size", "mem-offset"])?;
        let mc = DriverHandle::from_raw(self.handle(a.pos(0, "multicast object")?)?);
        let mc_offset = parse_number(a.pos(1, "multicast offset")?)?;
        let mem = DriverHandle::from_raw(self.handle(a.pos(2, "handle")?)?);
        let size = a
            .num_opt("size")?
            .ok_or_else(|| Fail::Usage("mc-bind-mem needs --size".into()))?;
        let mem_offset = a.num_opt("mem-offset")?.unwrap_or(0);
        self.driver.api().multicast_bind_mem(
            mc,
            mc_offset as usize,
            mem,
            mem_offset as usize,
            size as usize,
            0,
        )?;
        Ok(Reply::ok("mc-bind-mem")
            .with("mc_offset", mc_offset)
            .with("size", size))
    }

    /// `mc-bind-addr MC MC_OFFSET ADDR [--size S]`: `cuMulticastBindAddr` (default size: the
    /// room at ADDR).
    pub(super) fn mc_bind_addr(&mut self, a: &Args) -> Outcome {
        self.fake_only("mc-bind-addr")?;
        a.check(3, &["size"])?;
        let mc = DriverHandle::from_raw(self.handle(a.pos(0, "multicast object")?)?);
        let mc_offset = parse_number(a.pos(1, "multicast offset")?)?;
        let (address, room) = self.address(a.pos(2, "address")?)?;
        let size = a
            .num_opt("size")?
            .or(room)
            .ok_or_else(|| Fail::Usage("mc-bind-addr needs --size at a literal address".into()))?;
        self.driver
            .api()
            .multicast_bind_addr(mc, mc_offset as usize, address, size as usize, 0)?;
        Ok(Reply::ok("mc-bind-addr")
            .with("address", address)
            .with("size", size))
    }

    /// `mc-unbind MC MC_OFFSET SIZE [--device D]`: `cuMulticastUnbind`.
    pub(super) fn mc_unbind(&mut self, a: &Args) -> Outcome {
        self.fake_only("mc-unbind")?;
        a.check(3, &["device"])?;
        let mc = DriverHandle::from_raw(self.handle(a.pos(0, "multicast object")?)?);
        let mc_offset = parse_number(a.pos(1, "multicast offset")?)?;
        let size = parse_number(a.pos(2, "size")?)?;
        let device = self.driver.device(self.device_opt(a)?)?;
        self.driver
            .api()
            .multicast_unbind(mc, device, mc_offset as usize, size as usize)?;
        Ok(Reply::ok("mc-unbind"))
    }
}
